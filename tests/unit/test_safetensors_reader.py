from __future__ import annotations

import contextlib
import json
import math
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelrunner.artifact.safetensors import find_safetensors_shards, read_safetensors
from modelrunner.artifact.units import format_size
from modelrunner.errors import InvalidModelFile
from tests.models import (
    TINY_HF_VOCAB,
    tiny_hf_llama_shapes,
    write_safetensors,
    write_tiny_safetensors_dir,
)

TINY_PARAMS = sum(math.prod(s) for s in tiny_hf_llama_shapes(TINY_HF_VOCAB).values())


def raw_file(header: Any, data: bytes = b"", header_len: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data


def tensor(dtype: Any = "F32", shape: Any = (2,), offsets: Any = (0, 8)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


# --- happy path ------------------------------------------------------------------------------------------


def test_tiny_model_dir(tmp_path: Path) -> None:
    folder = write_tiny_safetensors_dir(tmp_path / "model")
    weights = folder / "model.safetensors"
    info = read_safetensors([weights], folder / "config.json")

    assert info.architecture == ""  # DMR reads __metadata__.architecture only, not config.json
    assert info.parameter_count == TINY_PARAMS == 107_072
    assert info.parameters == "107.07K"
    assert info.quantization == "F32"
    assert info.size_bytes == weights.stat().st_size
    assert info.size == format_size(weights.stat().st_size)
    assert info.context_size == 512
    assert info.metadata == {"format": "pt", "tensor_count": str(len(tiny_hf_llama_shapes(TINY_HF_VOCAB)))}


def test_without_config(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "m.safetensors", {"w": np.zeros((2, 3), dtype=np.float16)})
    info = read_safetensors([path], None)
    assert (info.architecture, info.context_size, info.quantization) == ("", None, "F16")
    assert info.parameter_count == 6
    assert info.metadata == {"tensor_count": "1"}


def test_architecture_comes_from_the_header_metadata(tmp_path: Path) -> None:
    # format/safetensors.go: header.Metadata["architecture"]; safetensors_model_test.go expects it.
    path = write_safetensors(
        tmp_path / "m.safetensors", {"w": np.zeros(2, dtype=np.float16)}, {"architecture": "LlamaForCausalLM"}
    )
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Other"]}))
    info = read_safetensors([path], tmp_path / "config.json")
    assert info.architecture == "LlamaForCausalLM"
    assert info.metadata == {"architecture": "LlamaForCausalLM", "tensor_count": "1"}


@pytest.mark.parametrize(
    ("config", "architecture", "context"),
    [
        ({"model_type": "qwen2", "n_ctx": 2048}, "", 2048),
        ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "", None),
        ({"n_ctx": 2048, "max_position_embeddings": 4096}, "", 4096),  # DMR's key order, not the file's
        ({"max_position_embeddings": "4096", "n_positions": 1024}, "", 1024),  # non-integers skipped
        ({"max_position_embeddings": True, "max_length": 0, "model_max_length": 300}, "", 300),
        ({"model_max_length": 10**30}, "", None),  # tokenizers' "unbounded" sentinel is not a context
        ({"max_position_embeddings": 2048.0}, "", None),
    ],
)
def test_config_fields(
    tmp_path: Path, config: dict[str, Any], architecture: str, context: int | None
) -> None:
    path = write_safetensors(tmp_path / "m.safetensors", {"w": np.zeros(2, dtype=np.float32)})
    (tmp_path / "config.json").write_text(json.dumps(config))
    info = read_safetensors([path], tmp_path / "config.json")
    assert (info.architecture, info.context_size) == (architecture, context)


def test_mixed_and_empty(tmp_path: Path) -> None:
    mixed = write_safetensors(
        tmp_path / "mixed.safetensors",
        {"a": np.zeros(4, dtype=np.float16), "b": np.zeros(4, dtype=np.float32), "c": np.zeros(0, np.int64)},
    )
    assert read_safetensors([mixed], None).quantization == "mixed"
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(raw_file({}))
    info = read_safetensors([empty], None)
    assert (info.quantization, info.parameter_count, info.metadata) == ("unknown", 0, {"tensor_count": "0"})


def test_sub_byte_and_fp8_dtypes(tmp_path: Path) -> None:
    path = tmp_path / "q.safetensors"
    header = {"a": tensor("F4", (4, 4), (0, 8)), "b": tensor("F8_E4M3", (8,), (8, 16))}
    path.write_bytes(raw_file(header, b"\0" * 16))
    info = read_safetensors([path], None)
    assert (info.parameter_count, info.quantization) == (24, "mixed")


def test_shards(tmp_path: Path) -> None:
    first = write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors", {"a": np.zeros((4, 4), np.float32)}, {"format": "pt"}
    )
    second = write_safetensors(
        tmp_path / "model-00002-of-00002.safetensors",
        {"b": np.zeros(8, np.float32), "c": np.zeros(2, np.float32)},
        {"format": "pt"},
    )
    assert find_safetensors_shards(second) == [first, second]
    assert find_safetensors_shards(tmp_path / "model.safetensors") == [tmp_path / "model.safetensors"]
    info = read_safetensors([first, second], None)
    assert info.parameter_count == 26
    assert info.size_bytes == first.stat().st_size + second.stat().st_size
    # DMR's values come from the first shard only: its 16 parameters and 1 tensor
    assert (info.parameters, info.metadata) == ("16.00", {"format": "pt", "tensor_count": "1"})

    second.unlink()
    with pytest.raises(InvalidModelFile) as err:
        find_safetensors_shards(first)
    assert err.value.message == "incomplete shard set: missing model-00002-of-00002.safetensors"


# --- hostile files ---------------------------------------------------------------------------------------

VALID_HEADER = {"__metadata__": {"format": "pt"}, "w": tensor()}

HOSTILE: dict[str, Callable[[], bytes]] = {
    "empty": lambda: b"",
    "shorter than the length": lambda: b"\x10\x00\x00",
    "header length 2**62": lambda: raw_file(VALID_HEADER, b"\0" * 8, header_len=2**62),
    "header length past the end": lambda: raw_file(VALID_HEADER, b"", header_len=200),
    "invalid JSON": lambda: raw_file(b'{"w": ', b""),
    "invalid UTF-8": lambda: raw_file(b'{"\xff\xfe": 1}'),
    "deeply nested JSON": lambda: raw_file(b"[" * 100_000 + b"]" * 100_000),
    "header not an object": lambda: raw_file([1, 2, 3]),
    "tensor not an object": lambda: raw_file({"w": [1, 2]}),
    "unknown dtype": lambda: raw_file({"w": tensor(dtype="F128")}, b"\0" * 8),
    "dtype not a string": lambda: raw_file({"w": tensor(dtype=32)}, b"\0" * 8),
    "negative dim": lambda: raw_file({"w": tensor(shape=(-2,))}, b"\0" * 8),
    "float dim": lambda: raw_file({"w": tensor(shape=(2.0,))}, b"\0" * 8),
    "bool dim": lambda: raw_file({"w": tensor(shape=(True, 2))}, b"\0" * 8),
    "shape not a list": lambda: raw_file(
        {"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}}, b"\0" * 8
    ),
    "huge dims": lambda: raw_file({"w": tensor(shape=(2**62, 2**62))}, b"\0" * 8),
    "absurdly long integer": lambda: raw_file(b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b"]}}"),
    "missing data_offsets": lambda: raw_file({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
    "three offsets": lambda: raw_file({"w": tensor(offsets=(0, 4, 8))}, b"\0" * 8),
    "negative offset": lambda: raw_file({"w": tensor(offsets=(-8, 0))}, b"\0" * 8),
    "begin after end": lambda: raw_file({"w": tensor(offsets=(8, 0))}, b"\0" * 8),
    "offsets past the data": lambda: raw_file({"w": tensor(offsets=(0, 2**40))}, b"\0" * 8),
    "size inconsistent with shape": lambda: raw_file({"w": tensor(shape=(3,))}, b"\0" * 8),
    "sub-byte size not whole bytes": lambda: raw_file({"w": tensor("F4", (3,), (0, 2))}, b"\0" * 2),
    "gap between tensors": lambda: raw_file({"a": tensor(), "b": tensor(offsets=(12, 20))}, b"\0" * 20),
    "overlapping tensors": lambda: raw_file({"a": tensor(), "b": tensor(offsets=(4, 12))}, b"\0" * 12),
    "trailing bytes": lambda: raw_file(VALID_HEADER, b"\0" * 9),
    "metadata not an object": lambda: raw_file({"__metadata__": ["x"]}),
    "metadata value not a string": lambda: raw_file({"__metadata__": {"n": 1}}),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_file_refused(tmp_path: Path, case: str) -> None:
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(HOSTILE[case]())
    with pytest.raises(InvalidModelFile) as err:
        read_safetensors([path], None)
    message = err.value.message
    assert message.startswith("hostile.safetensors: ") and len(message) > len("hostile.safetensors: ")
    assert str(tmp_path) not in message


def test_valid_header_of_the_hostile_table_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "ok.safetensors"
    path.write_bytes(raw_file(VALID_HEADER, b"\0" * 8))
    assert read_safetensors([path], None).parameter_count == 2


def test_header_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import modelrunner.artifact.safetensors as reader

    monkeypatch.setattr(reader, "_MAX_JSON_BYTES", 16)  # the real 100 MB cap, scaled down
    path = tmp_path / "big.safetensors"
    path.write_bytes(raw_file(VALID_HEADER, b"\0" * 8))
    with pytest.raises(InvalidModelFile, match="limit"):
        read_safetensors([path], None)


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe", b'"text"'])
def test_bad_config_json_only_means_no_context_size(tmp_path: Path, content: bytes) -> None:
    # format/safetensors.go: readContextSizeConfig's error is logged, the config built without it.
    path = write_safetensors(tmp_path / "m.safetensors", {"w": np.zeros(2, dtype=np.float32)})
    (tmp_path / "config.json").write_bytes(content)
    assert read_safetensors([path], tmp_path / "config.json").context_size is None


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelFile, match=r"^missing\.safetensors: cannot read file"):
        read_safetensors([tmp_path / "missing.safetensors"], None)
    path = write_safetensors(tmp_path / "m.safetensors", {"w": np.zeros(2, dtype=np.float32)})
    assert read_safetensors([path], tmp_path / "config.json").context_size is None  # no config.json


def test_random_corruption_never_escapes_as_another_error(tmp_path: Path) -> None:
    tensors: dict[str, np.ndarray[Any, Any]] = {
        "a": np.zeros((3, 4), np.float32),
        "b": np.ones(5, np.float16),
    }
    valid = write_safetensors(tmp_path / "ok.safetensors", tensors, {"format": "pt"}).read_bytes()
    rng = random.Random(7)
    path = tmp_path / "fuzz.safetensors"
    for _ in range(250):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data[: rng.randrange(len(data))] if rng.random() < 0.2 else data))
        with contextlib.suppress(InvalidModelFile):
            read_safetensors([path], None)
