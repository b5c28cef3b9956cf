"""Forward compatibility as DMR has it: layers of media types this version does not know are kept and
ignored, and model tars may hold entries besides the blobs and the manifest. Every safety check stays:
unsafe paths, path collisions, malformed digests.

DMR: oci.ParseManifest reads any layer type, and the bundle unpacks only the types it knows
(internal/bundle/unpack.go); tarball/reader.go skips entries that are not regular files named
`blobs/<algorithm>/<hex>` or `manifest.json`.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.manifest import parse_manifest
from modelrunner.errors import InvalidArtifact
from modelrunner.store.archive import export_chunks, load_archive
from modelrunner.store.store import ModelStore
from tests.conformance.dmr_layout import (
    ASSETS,
    GGUF,
    GOLDEN_CONFIG,
    GOLDEN_ID,
    GOLDEN_MANIFEST,
    golden_dummy,
    layer_json,
    manifest_json,
    sha256,
    write_dmr_store,
)

# Types of the model-spec that this version does not use, and one from a future version.
UNKNOWN_TYPES = [
    "application/vnd.docker.ai.gguf.v3.lora",
    "application/vnd.docker.ai.gguf.v3.mmproj",
    "application/vnd.docker.ai.something.v9+json",
]


def with_unknown_layer(media_type: str, name: str = "adapter.gguf") -> tuple[bytes, bytes]:
    """dummy.gguf's model plus one layer of `media_type`: (manifest, the extra layer's bytes)."""
    extra = b"lora adapter bytes"
    layers = [layer_json(GGUF, (ASSETS / "dummy.gguf").read_bytes(), "dummy.gguf")]
    layers.append(layer_json(media_type, extra, name))
    return manifest_json(GOLDEN_CONFIG, layers), extra


@pytest.mark.parametrize("media_type", UNKNOWN_TYPES)
def test_unknown_layer_types_are_kept_and_ignored(tmp_path: Path, media_type: str) -> None:
    manifest, extra = with_unknown_layer(media_type)
    parsed = parse_manifest(manifest)
    assert [layer.media_type for layer in parsed.layers] == [mt.GGUF, media_type]

    store = ModelStore(tmp_path / "models")
    for data in (GOLDEN_CONFIG, extra, (ASSETS / "dummy.gguf").read_bytes()):
        store.write_blob_bytes(data)
    model_id = store.add_model(manifest, ["with-adapter"])
    assert model_id == sha256(manifest)
    bundle = store.bundle("with-adapter")
    assert sorted(p.name for p in (bundle / "model").iterdir()) == ["model.gguf"]  # the adapter is ignored
    assert store.get(model_id).manifest.layers[1].digest == sha256(extra)  # still part of the model

    exported = b"".join(export_chunks(store, "with-adapter"))  # and it travels with it
    other = ModelStore(tmp_path / "other")
    assert load_archive(other, io.BytesIO(exported)) == model_id
    assert other.has_blob(sha256(extra))


@pytest.mark.parametrize(
    ("name", "problem"),
    [("../adapter.gguf", "unsafe"), ("/etc/passwd", "unsafe"), ("dummy.gguf", "same file path")],
)
def test_unknown_layers_still_get_every_path_check(name: str, problem: str) -> None:
    manifest, _ = with_unknown_layer(UNKNOWN_TYPES[0], name)
    with pytest.raises(InvalidArtifact, match=problem):
        parse_manifest(manifest)


def test_unknown_layers_still_need_valid_digests() -> None:
    doc = json.loads(with_unknown_layer(UNKNOWN_TYPES[0])[0])
    doc["layers"][1]["digest"] = "sha512:" + "a" * 128
    with pytest.raises(InvalidArtifact):
        parse_manifest(json.dumps(doc).encode())


def _members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as archive:
        return [(m, (archive.extractfile(m) or io.BytesIO()).read() if m.isreg() else b"") for m in archive]


def test_dmrs_reader_test_archive_is_walked_as_dmr_walks_it(tmp_path: Path) -> None:
    # follows pkg/distribution/tarball/reader_test.go: TestStream on testdata/archive.tar: folders and
    # ignore-me/.gitkeep skipped, blobs/sha256/... read as a blob, manifest.json read as the manifest.
    # Its manifest is the text "some-manifest-contents": not a manifest, so the load is refused cleanly.
    store = ModelStore(tmp_path / "models")
    with pytest.raises(InvalidArtifact, match="not valid JSON"), (ASSETS / "archive.tar").open("rb") as f:
        load_archive(store, f)
    assert store.list_models() == []
    assert not any((store.layout.blobs_dir).iterdir())  # the blob it read was removed again


def test_a_model_tar_with_dmrs_extra_entries_loads(tmp_path: Path) -> None:
    # the entries of upstream's archive.tar (a folder, ignore-me/.gitkeep, a sha512 blob, a stray sha256
    # blob) around a real model: they are skipped, the model loads, the stray blob is not kept
    source = tmp_path / "src"
    write_dmr_store(source, [golden_dummy(["docker.io/ai/dummy:latest"])])
    extras = [(m, data) for m, data in _members(ASSETS / "archive.tar") if m.name != "manifest.json"]
    model = _members_of(ModelStore(source))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for member, data in [*extras, *model]:
            archive.addfile(member, io.BytesIO(data) if member.isreg() else None)
    store = ModelStore(tmp_path / "models")
    buffer.seek(0)
    assert load_archive(store, buffer) == GOLDEN_ID
    assert store.read_manifest(GOLDEN_ID) == GOLDEN_MANIFEST
    assert not store.has_blob("sha256:bec7cb2222b54879bf3c7e70504960bdfbd898a05ab1f8247808484869a46bad")


def _members_of(store: ModelStore) -> list[tuple[tarfile.TarInfo, bytes]]:
    exported = b"".join(export_chunks(store, "dummy"))
    with tarfile.open(fileobj=io.BytesIO(exported)) as archive:
        return [(m, (archive.extractfile(m) or io.BytesIO()).read()) for m in archive]
