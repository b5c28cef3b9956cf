"""Safetensors packaging as DMR does it: builder/from_directory.go (layer per file, Go's walk order,
v0.2 config) and format/safetensors.go (config values), checked on upstream's expectations."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.builder import HashingSink, PackageSpec, build_artifact
from tests.conformance.dmr_layout import sha256

F32_2 = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


def write_safetensors(path: Path, header: dict[str, Any], data_size: int) -> Path:
    """As safetensors_model_test.go: createTestSafetensorsFile (header JSON with Go's sorted keys)."""
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + data_size)  # zeros, without writing 32 MB
    return path


def test_safetensors_model_with_metadata(tmp_path: Path) -> None:
    # follows pkg/distribution/builder/safetensors_model_test.go: TestSafetensorsModel_WithMetadata
    header = {
        "__metadata__": {"architecture": "LlamaForCausalLM", "version": "1.0"},
        "model.layers.0.weight": {"dtype": "F16", "shape": [4096, 4096], "data_offsets": [0, 33554432]},
        "model.layers.0.bias": {"dtype": "F16", "shape": [4096], "data_offsets": [33554432, 33562624]},
    }
    write_safetensors(tmp_path / "model" / "test.safetensors", header, 33562624)
    built = build_artifact(PackageSpec(safetensors_dir=tmp_path / "model"), HashingSink())
    config = json.loads(built.config_bytes)["config"]
    assert config["format"] == "safetensors"
    assert config["architecture"] == "LlamaForCausalLM"
    assert config["parameters"] == "16.78M"
    assert config["quantization"] == "F16"
    assert config["size"] == "33.56MB"
    assert config["safetensors"] == {
        "architecture": "LlamaForCausalLM",
        "version": "1.0",
        "tensor_count": "2",
    }
    [layer] = built.manifest.layers
    assert layer.annotations[mt.ANNOTATION_FILEPATH] == "test.safetensors"
    assert layer.annotations[mt.ANNOTATION_MEDIATYPE_UNTESTED] == "false"
    metadata = json.loads(layer.annotations[mt.ANNOTATION_FILE_METADATA])
    assert metadata["name"] == "test.safetensors" and metadata["size"] > 0
    assert built.manifest.config.media_type == mt.CONFIG_V02  # FromDirectory: MediaTypeModelConfigV02


# Produced by Go's filepath.Walk over this tree, with FromDirectory's skips (dot-names, symlinks):
# depth first, names sorted by their bytes, a folder's files where the folder's name sorts.
GO_WALK_ORDER = [
    "B/y",
    "Z.json",
    "a/C.txt",
    "a/b.txt",
    "a-b.txt",
    "a.b/x",
    "a.txt",
    "a0.txt",
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "z/model.safetensors",
]


def test_layers_follow_go_walk_order(tmp_path: Path) -> None:
    # follows builder/from_directory.go: filepath.Walk, hidden files and folders and symlinks skipped
    root = tmp_path / "m"
    weights = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    for name in GO_WALK_ORDER:
        path = root / name
        if name.endswith(".safetensors"):
            write_safetensors(path, weights, 8)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / "a" / ".x").write_text("hidden\n")
    os.symlink(root / "a.txt", root / "link.txt")
    built = build_artifact(PackageSpec(safetensors_dir=root), HashingSink())
    assert [layer.filepath for layer in built.manifest.layers] == GO_WALK_ORDER
    by_path = {layer.filepath: layer.media_type for layer in built.manifest.layers}
    assert by_path["Z.json"] == mt.MODEL_FILE  # files/classify.go: config files are model files
    assert by_path["z/model.safetensors"] == mt.SAFETENSORS
    names = [
        json.loads(layer.annotations[mt.ANNOTATION_FILE_METADATA])["name"] for layer in built.manifest.layers
    ]
    assert names[0] == "y" and names[-1] == "model.safetensors"  # base names, as NewLayerWithRelativePath


def test_config_values_come_from_the_first_weight_file(tmp_path: Path) -> None:
    # follows format/safetensors.go: ExtractConfig parses paths[0] only; the size is every weight file's;
    # the context size is config.json's first usable key (max_position_embeddings, n_ctx, ...)
    root = tmp_path / "m"
    first = write_safetensors(
        root / "model-00001-of-00002.safetensors",
        {"__metadata__": {"format": "pt"}, "a": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}},
        32,
    )
    second = write_safetensors(
        root / "model-00002-of-00002.safetensors",
        {"b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
        8,
    )
    (root / "config.json").write_text(
        json.dumps({"architectures": ["X"], "n_ctx": 4096.0, "n_positions": 1024})
    )
    built = build_artifact(PackageSpec(safetensors_dir=root), HashingSink(), created=None)
    doc = json.loads(built.config_bytes)
    size = first.stat().st_size + second.stat().st_size
    assert doc["config"] == {
        "format": "safetensors",
        "quantization": "BF16",
        "parameters": "16.00",
        "size": f"{size:.2f}B",
        "safetensors": {"format": "pt", "tensor_count": "1"},
        "context_size": 1024,  # 4096.0 is not an integer to Go's decoder
    }
    assert doc["rootfs"]["diff_ids"] == [
        sha256((root / name).read_bytes()) for name in ("config.json", first.name, second.name)
    ]


def test_unreadable_config_json_only_drops_the_context_size(tmp_path: Path) -> None:
    # follows format/safetensors.go: a readContextSizeConfig error is logged and packaging goes on
    root = tmp_path / "m"
    write_safetensors(
        root / "model.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 8
    )
    (root / "config.json").write_bytes(b"{broken")
    config = json.loads(build_artifact(PackageSpec(safetensors_dir=root), HashingSink()).config_bytes)[
        "config"
    ]
    assert "context_size" not in config and config["quantization"] == "F32"
