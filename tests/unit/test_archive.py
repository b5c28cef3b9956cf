"""Model tar export/load (store/archive.py) and the streaming tar writer (artifact/tar_stream.py).

Contract 3.6: `blobs/sha256/<hex>` entries, then `manifest.json`; a load verifies every blob, registers the
model untagged, and a bad archive leaves the store as it was.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from modelrunner.artifact.builder import PackageSpec
from modelrunner.artifact.manifest import MAX_MANIFEST_BYTES, sha256_digest
from modelrunner.artifact.tar_stream import BLOCK, tar_chunks, tar_header
from modelrunner.errors import InvalidArtifact, ModelNotFound
from modelrunner.store.archive import export_chunks, load_archive
from modelrunner.store.store import ModelStore
from tests.models import write_tiny_safetensors_dir


def export(store: ModelStore, reference: str) -> bytes:
    return b"".join(export_chunks(store, reference))


def load(store: ModelStore, data: bytes) -> str:
    return load_archive(store, io.BytesIO(data))


def entries(data: bytes) -> list[tuple[str, bytes]]:
    """(name, content) of every member of a tar, in order."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as archive:
        out = []
        for member in archive:
            handle = archive.extractfile(member)
            out.append((member.name, handle.read() if handle else b""))
        return out


def entry(
    name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, linkname: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o644
    return info, data


def make_tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    """A second, empty store to load archives into."""
    monkeypatch.delenv("DEFAULT_REGISTRY", raising=False)
    return ModelStore(tmp_path / "target")


@pytest.fixture
def archive(store: ModelStore, tiny_model: str) -> bytes:
    """The tiny model exported from the source store."""
    return export(store, tiny_model)


# --- export and load ---------------------------------------------------------------------------------------


def assert_same_model(source: ModelStore, target: ModelStore, model_id: str) -> None:
    assert target.read_manifest(model_id) == source.read_manifest(model_id)
    for blob in source.get(model_id).manifest.blobs:
        assert (
            target.layout.blob_path(blob.digest).read_bytes()
            == source.layout.blob_path(blob.digest).read_bytes()
        )
    assert target.get(model_id).config == source.get(model_id).config


def test_export_then_load_into_an_empty_store_gives_the_same_model(
    store: ModelStore, target: ModelStore, tiny_model: str, archive: bytes
) -> None:
    assert load(target, archive) == tiny_model
    assert_same_model(store, target, tiny_model)
    assert target.get(tiny_model).tags == []  # registered by digest, untagged
    assert (target.bundle(tiny_model) / "model" / "model.gguf").is_file()


def test_export_and_load_of_a_v02_safetensors_model(
    store: ModelStore, target: ModelStore, package: Callable[..., str], tmp_path: Path
) -> None:
    model_id = package(PackageSpec(safetensors_dir=write_tiny_safetensors_dir(tmp_path / "hf")), ("ai/st",))
    assert load(target, export(store, "ai/st")) == model_id
    assert_same_model(store, target, model_id)
    assert (target.bundle(model_id) / "model" / "sub" / "extra.txt").is_file()


def test_exporting_twice_gives_identical_bytes(store: ModelStore, tiny_model: str, archive: bytes) -> None:
    assert export(store, "ai/tiny") == archive
    assert export(store, tiny_model[:19].removeprefix("sha256:")) == archive


def test_export_lists_blobs_then_the_raw_manifest(store: ModelStore, tiny_model: str, archive: bytes) -> None:
    model = store.get(tiny_model)
    assert entries(archive) == [
        *[
            (
                f"blobs/sha256/{b.digest.removeprefix('sha256:')}",
                store.layout.blob_path(b.digest).read_bytes(),
            )
            for b in model.manifest.blobs
        ],
        ("manifest.json", store.read_manifest(tiny_model)),
    ]
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|") as tar:
        for member in tar:
            assert (member.mode, member.mtime, member.uid, member.gid) == (0o644, 0, 0, 0)
            assert member.isreg()
    assert len(archive) % BLOCK == 0


def test_export_of_an_unknown_model_is_refused(store: ModelStore, tiny_model: str, refuses: Any) -> None:
    with refuses(ModelNotFound, store):
        export(store, "ai/unknown")


def test_loading_the_same_archive_twice_changes_nothing(
    target: ModelStore, archive: bytes, take_snapshot: Callable[[Path], Any]
) -> None:
    first = load(target, archive)
    before = take_snapshot(target.layout.root)
    assert load(target, archive) == first
    assert take_snapshot(target.layout.root) == before


def test_a_blob_already_in_the_store_is_not_rewritten(
    target: ModelStore, tiny_model: str, archive: bytes, tiny_gguf: Path
) -> None:
    digest, _ = target.ingest_file(tiny_gguf)
    blob = target.layout.blob_path(digest)
    os.utime(blob, ns=(1_000_000_000, 1_000_000_000))
    before = os.stat(blob)
    assert load(target, archive) == tiny_model
    after = os.stat(blob)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


# --- refused archives --------------------------------------------------------------------------------------


def good_blobs(archive: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    return [entry(name, data) for name, data in entries(archive) if name.startswith("blobs/")]


def manifest_of(archive: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return entry("manifest.json", dict(entries(archive))["manifest.json"])


def with_bad_entry(bad: tuple[tarfile.TarInfo, bytes]) -> Callable[[bytes], bytes]:
    """Every good blob first (so there is something to undo), then the bad entry, then the manifest."""
    return lambda archive: make_tar([*good_blobs(archive), bad, manifest_of(archive)])


def _truncated_in_blob_data(archive: bytes) -> bytes:
    return archive[: BLOCK + 100]


def _cut_before_manifest(archive: bytes) -> bytes:
    manifest = dict(entries(archive))["manifest.json"]
    manifest_entry = BLOCK + len(manifest) + (-len(manifest) % BLOCK)
    return archive[: len(archive) - 2 * BLOCK - manifest_entry]


def _mismatched_blob(archive: bytes) -> bytes:
    blobs = good_blobs(archive)
    info, data = blobs[-1]  # the config blob: same name and size, different content
    blobs[-1] = (info, data.replace(b"gguf", b"GGUF", 1))
    return make_tar([*blobs, manifest_of(archive)])


def _layers_missing(archive: bytes) -> bytes:
    return make_tar([good_blobs(archive)[-1], manifest_of(archive)])


def _invalid_manifest(archive: bytes) -> bytes:
    return make_tar([*good_blobs(archive), entry("manifest.json", b'{"schemaVersion": 2}')])


def _huge_manifest(archive: bytes) -> bytes:
    _, manifest = manifest_of(archive)
    padded = manifest + b" " * (MAX_MANIFEST_BYTES + 1 - len(manifest))
    return make_tar([*good_blobs(archive), entry("manifest.json", padded)])


SOME_HEX = "ab" * 32

BAD_ARCHIVES: dict[str, Callable[[bytes], bytes]] = {
    "not a tar": lambda a: b"this is not a tar archive\n" * 100,
    "empty stream": lambda a: b"",
    "zeros only": lambda a: b"\0" * 4096,
    "truncated inside a header": lambda a: a[:100],
    "truncated inside blob data": _truncated_in_blob_data,
    "truncated in the middle": lambda a: a[: len(a) // 2],
    "truncated before the manifest": _cut_before_manifest,
    "entry ../evil": with_bad_entry(entry("../evil", b"x")),
    "entry blobs/../../evil": with_bad_entry(entry("blobs/../../evil", b"x")),
    "absolute entry name": with_bad_entry(entry(f"/blobs/sha256/{SOME_HEX}", b"x")),
    "absolute manifest name": lambda a: make_tar(
        [*good_blobs(a), entry("/manifest.json", manifest_of(a)[1])]
    ),
    "character device entry": with_bad_entry(entry("blobs/sha256/dev", kind=tarfile.CHRTYPE)),
    "FIFO entry": with_bad_entry(entry("blobs/sha256/fifo", kind=tarfile.FIFOTYPE)),
    "folder ../evil": with_bad_entry(entry("../evil", kind=tarfile.DIRTYPE)),
    "symlink entry ../x": with_bad_entry(entry("a/../../x", kind=tarfile.SYMTYPE, linkname="/etc")),
    "two manifest.json": lambda a: make_tar([*good_blobs(a), manifest_of(a), manifest_of(a)]),
    "uppercase blob name": with_bad_entry(entry("blobs/sha256/" + SOME_HEX.upper(), b"x")),
    "blob that does not match its name": _mismatched_blob,
    "no manifest.json": lambda a: make_tar(good_blobs(a)),
    "manifest layers in neither tar nor store": _layers_missing,
    "invalid manifest": _invalid_manifest,
    "manifest.json over 4 MiB": _huge_manifest,
}


@pytest.mark.parametrize("case", BAD_ARCHIVES)
def test_a_bad_archive_is_refused_and_leaves_the_target_store_unchanged(
    target: ModelStore, archive: bytes, refuses: Any, case: str
) -> None:
    data = BAD_ARCHIVES[case](archive)
    with refuses(InvalidArtifact, target):
        load(target, data)
    assert target.list_models() == []


# Entries DMR's reader skips (pkg/distribution/tarball/reader.go: not regular files, or not
# blobs/<alg>/<hex>); skipping them is safe because nothing is ever written from an entry's name.
SKIPPED_ENTRIES: dict[str, tuple[tarfile.TarInfo, bytes]] = {
    "symlink entry": entry(f"blobs/sha256/{SOME_HEX}", kind=tarfile.SYMTYPE, linkname="/etc"),
    "hard-link entry": entry(f"blobs/sha256/{SOME_HEX}", kind=tarfile.LNKTYPE, linkname="manifest.json"),
    "folder": entry("evil", kind=tarfile.DIRTYPE),
    "file outside blobs/": entry("README.md", b"hello"),
    "file in a folder": entry("ignore-me/.gitkeep", b""),
    "sha512 blob": entry("blobs/sha512/" + "ab" * 64, b"x"),
    "blob name one level too deep": entry(f"blobs/sha256/{SOME_HEX}/x", b"x"),
}


@pytest.mark.parametrize("case", SKIPPED_ENTRIES)
def test_entries_dmr_skips_are_skipped_and_the_model_loads(
    target: ModelStore, archive: bytes, tiny_model: str, case: str
) -> None:
    assert load(target, with_bad_entry(SKIPPED_ENTRIES[case])(archive)) == tiny_model
    assert not (target.layout.root / "evil").exists()
    assert not target.has_blob("sha256:" + SOME_HEX)


def test_a_refused_archive_keeps_blobs_that_were_in_the_store_before(
    store: ModelStore, target: ModelStore, tiny_model: str, archive: bytes, refuses: Any
) -> None:
    load(target, archive)  # the target already has every blob of the model
    bad = with_bad_entry(entry("../evil", b"x"))(archive)
    with refuses(InvalidArtifact, target):
        load(target, bad)
    assert_same_model(store, target, tiny_model)


def test_blobs_the_manifest_does_not_list_are_not_kept(target: ModelStore, archive: bytes) -> None:
    stray = b"not part of the model"
    extra = entry("blobs/sha256/" + sha256_digest(stray).removeprefix("sha256:"), stray)
    model_id = load(target, make_tar([extra, *good_blobs(archive), manifest_of(archive)]))
    assert target.get(model_id).id == model_id
    assert not target.has_blob(sha256_digest(stray))


# --- tar_stream --------------------------------------------------------------------------------------------


def test_tar_chunks_writes_a_tar_that_tarfile_reads() -> None:
    data = b"".join(
        tar_chunks([("a.bin", 3, [b"a", b"bc"]), ("empty", 0, []), ("block.bin", BLOCK, [b"x" * BLOCK])])
    )
    assert entries(data) == [("a.bin", b"abc"), ("empty", b""), ("block.bin", b"x" * BLOCK)]
    assert len(data) == 3 * BLOCK + BLOCK + 0 + BLOCK + 2 * BLOCK  # headers, padded data, two end blocks
    assert data.endswith(b"\0" * 2 * BLOCK)


def test_tar_header_is_one_block_with_a_fixed_mtime() -> None:
    header = tar_header("blobs/sha256/" + SOME_HEX, 12345)
    assert len(header) == BLOCK
    info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
    assert (info.name, info.size, info.mtime, info.mode) == ("blobs/sha256/" + SOME_HEX, 12345, 0, 0o644)


@pytest.mark.parametrize(("declared", "chunks"), [(5, [b"abc"]), (2, [b"abc"]), (1, [])])
def test_tar_chunks_refuses_content_that_does_not_match_its_size(declared: int, chunks: list[bytes]) -> None:
    with pytest.raises(ValueError, match="changed while it was archived"):
        b"".join(tar_chunks([("x", declared, chunks)]))


def test_tar_chunks_streams_lazily() -> None:
    pulled: list[int] = []

    def content() -> Any:
        for i in range(3):
            pulled.append(i)
            yield b"x"

    stream = tar_chunks([("x", 3, content())])
    assert next(stream) == tar_header("x", 3)
    assert pulled == []
    assert next(stream) == b"x"
    assert pulled == [0]  # nothing is read ahead of what was sent
