"""GGUF config values as DMR computes them (pkg/distribution/format/gguf.go over gguf-parser-go v0.24.0),
checked on upstream's own assets and expectations."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from modelrunner.artifact.builder import HashingSink, PackageSpec, build_artifact
from modelrunner.artifact.gguf import read_gguf
from modelrunner.artifact.gguf_config import bytes_text, parameters_text
from tests.conformance.dmr_layout import ASSETS, DUMMY_GGUF


def config_of(spec: PackageSpec) -> dict[str, object]:
    built = build_artifact(spec, HashingSink())
    config: dict[str, object] = json.loads(built.config_bytes)["config"]
    return config


def test_dummy_gguf_config_values() -> None:
    # follows pkg/distribution/builder/gguf_model_test.go: TestGGUFModel/TestConfig
    config = config_of(PackageSpec(gguf=DUMMY_GGUF))
    assert config["format"] == "gguf"
    assert config["parameters"] == "183"
    assert config["architecture"] == "llama"  # no general.architecture: gguf-parser's default
    assert config["quantization"] == "Unknown"  # no general.file_type, no tensor the guess counts
    assert config["size"] == "864B"  # the tensor data, not the 2016-byte file
    assert "context_size" not in config  # no llama.context_length: left out (omitempty)
    expected = {
        "some.parameter.uint8": "18",
        "some.parameter.int8": "-19",
        "some.parameter.uint16": "4660",
        "some.parameter.int16": "-4661",
        "some.parameter.uint32": "305419896",
        "some.parameter.int32": "-305419897",
        "some.parameter.float32": "0.123457",
        "some.parameter.uint64": "1311768467463790320",
        "some.parameter.int64": "-1311768467463790321",
        "some.parameter.float64": "0.123457",
        "some.parameter.bool": "true",
        "some.parameter.string": "hello world",
        "some.parameter.arr.i16": "1, 2, 3, 4",
    }
    gguf = config["gguf"]
    assert isinstance(gguf, dict)
    assert {key: gguf[key] for key in expected} == expected


def test_sharded_dummy_reads_every_shard() -> None:
    # gguf-parser's ParseGGUFFile completes the shard set (CompleteShardGGUFFilename) and reads all of
    # it: the tensors of shard 2, the metadata of both without split.no. Any member finds the set.
    for member in ("dummy-00001-of-00002.gguf", "dummy-00002-of-00002.gguf"):
        built = build_artifact(PackageSpec(gguf=ASSETS / member), HashingSink())
        assert [layer.filepath for layer in built.manifest.layers] == [
            "dummy-00001-of-00002.gguf",
            "dummy-00002-of-00002.gguf",
        ]
        config = json.loads(built.config_bytes)["config"]
        assert (config["parameters"], config["architecture"], config["quantization"]) == (
            "183",
            "llama",
            "Unknown",
        )
        assert config["gguf"]["split.count"] == "2"
        assert config["gguf"]["split.tensors.count"] == "10"
        assert "split.no" not in config["gguf"]
        assert config["gguf"]["some.parameter.string"] == "hello world"


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0B"),
        (864, "864B"),  # gguf_model_test.go
        (1000, "1KB"),  # K (1e3) below Ki (1024): two decimals, ".00" dropped
        (1010, "1.01KB"),
        (1024, "1KiB"),
        (268_803_686, "256.35MiB"),  # format.go's example
        (5 * 2**30, "5GiB"),
    ],
)
def test_sizes_in_gguf_parser_units(count: int, text: str) -> None:
    # follows gguf-parser-go scalar.go (GGUFBytesScalar.String) and format/gguf.go: normalizeUnitString
    assert bytes_text(count) == text


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0"), (183, "183"), (16_781_312, "16.78M"), (1_000_000, "1M"), (8_030_000_000, "8.03B")],
)
def test_parameters_in_gguf_parser_units(count: int, text: str) -> None:
    # follows gguf-parser-go scalar.go (GGUFParametersScalar.String); format_test.go: "16.78 M" -> "16.78M"
    assert parameters_text(count) == text


def _gguf(
    path: Path, kvs: list[tuple[str, int, bytes]], tensors: list[tuple[str, int, int]]
) -> tuple[Path, int]:
    """A GGUF v3 file from (key, value type, packed value) pairs and (name, ggml type, elements) 1-D
    tensors (F32, F16 or Q8_0), data at the next 32-byte boundary; also returns the header's length."""

    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    def n_bytes(ggml_type: int, n: int) -> int:
        return {0: 4 * n, 1: 2 * n, 8: n // 32 * 34}[ggml_type]

    body = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, vtype, packed in kvs:
        body += string(key) + struct.pack("<I", vtype) + packed
    data = b""
    for name, ggml_type, n in tensors:
        body += string(name) + struct.pack("<IQIQ", 1, n, ggml_type, len(data))
        size = n_bytes(ggml_type, n)
        data += b"\0" * (size + -size % 32)
    path.write_bytes(body + b"\0" * (-len(body) % 32) + data)
    return path, len(body)


def _u32(value: int) -> tuple[int, bytes]:
    return 4, struct.pack("<I", value)


def _str(text: str) -> tuple[int, bytes]:
    return 8, struct.pack("<Q", len(text)) + text.encode()


@pytest.mark.parametrize(
    ("kvs", "tensors", "architecture", "quantization"),
    [
        # file_metadata.go Metadata(): general.architecture, else llama; extractFileType: the name of
        # general.file_type (GGUFFileType's stringer, MOSTLY_ prefix included), else a guess from the
        # counted tensors (token_embd*, blk.*, *_norm*, *.weight) with F32 set aside.
        (
            [("general.architecture", *_str("qwen2")), ("general.file_type", *_u32(15))],
            [],
            "qwen2",
            "MOSTLY_Q4_K_M",
        ),
        ([("general.file_type", *_u32(1))], [("blk.0.w", 0, 32)], "llama", "MOSTLY_F16"),
        ([], [("blk.0.a.weight", 1, 32), ("blk.0.norm", 0, 32)], "llama", "MOSTLY_F16"),
        ([], [("blk.0.a.weight", 0, 32)], "llama", "MOSTLY_F32"),
        ([], [("blk.0.a.weight", 8, 64), ("blk.1.a.weight", 8, 64)], "llama", "MOSTLY_Q8_0"),
        ([], [("tensor_0", 0, 32)], "llama", "Unknown"),  # nothing counted, as dummy.gguf
        ([("general.file_type", *_u32(39))], [("blk.0.a.weight", 1, 32)], "llama", "MOSTLY_F16"),
        ([("general.file_type", *_u32(40))], [], "llama", "GGUFFileType(40)"),
        (
            [("general.architecture", *_str("flux"))],
            [("double_blocks.0.weight", 0, 32)],
            "diffusion",
            "MOSTLY_F32",
        ),
        ([], [("double_blocks.0.bias", 0, 32)], "diffusion", "Unknown"),  # diffusion: *.weight only
        ([("controlvector.model_hint", *_str("mistral"))], [], "mistral", "Unknown"),
        ([("general.type", *_str("imatrix"))], [], "imatrix", "Unknown"),
    ],
)
def test_architecture_and_quantization_follow_gguf_parser(
    tmp_path: Path,
    kvs: list[tuple[str, int, bytes]],
    tensors: list[tuple[str, int, int]],
    architecture: str,
    quantization: str,
) -> None:
    info = read_gguf([_gguf(tmp_path / "m.gguf", kvs, tensors)[0]])
    assert (info.architecture, info.quantization) == (architecture, quantization)


@pytest.mark.parametrize(
    ("kvs", "context"),
    [
        ([("llama.context_length", *_u32(4096))], 4096),
        ([("general.architecture", *_str("qwen2")), ("qwen2.context_length", *_u32(32768))], 32768),
        ([("general.architecture", *_str("clip")), ("clip.context_length", *_u32(77))], None),
        ([("general.type", *_str("adapter")), ("llama.context_length", *_u32(4096))], None),
        ([("llama.context_length", *_u32(2**31))], None),  # DMR keeps 1..MaxInt32 only
        ([("llama.context_length", *_str("4096"))], None),
    ],
)
def test_context_size_is_the_transformer_context_length(
    tmp_path: Path, kvs: list[tuple[str, int, bytes]], context: int | None
) -> None:
    # gguf.go: Architecture().MaximumContextLength, set by transformerArchitecture only
    assert read_gguf([_gguf(tmp_path / "m.gguf", kvs, [])[0]]).context_size == context


def test_model_size_counts_a_whole_alignment_when_the_header_ends_aligned(tmp_path: Path) -> None:
    # gguf-parser file.go: padding = alignment - (header_end % alignment), a whole 32 bytes when the
    # header already ends aligned; ModelSize = file size - (header_end + padding).
    sizes = {}
    for pad in range(32):
        path, header = _gguf(tmp_path / f"m{pad}.gguf", [("k" + "y" * pad, *_u32(1))], [("w", 0, 32)])
        sizes[header % 32 == 0] = read_gguf([path]).size
    assert sizes == {False: "128B", True: "96B"}
