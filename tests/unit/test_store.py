"""The local store (store/store.py, layout.py, bundle.py) and file primitives (fileio.py): contract 4."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import multiprocessing
import os
import stat
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from modelrunner import fileio
from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.builder import PackageSpec
from modelrunner.artifact.manifest import Descriptor, Manifest, sha256_digest
from modelrunner.artifact.model_config import make_config_blob
from modelrunner.errors import (
    BadRequest,
    Conflict,
    InvalidArtifact,
    InvalidDigest,
    InvalidReference,
    ModelNotFound,
    StoreCorrupted,
)
from modelrunner.fileio import (
    HashingWriter,
    copy_and_hash,
    hash_file,
    open_regular_file,
    require_regular_file,
    write_file_atomic,
)
from modelrunner.store.layout import StoreLayout
from modelrunner.store.store import INCOMPLETE_MAX_AGE, STRAY_INGEST_IDLE, ModelStore
from tests.models import (
    CHAT_TEMPLATE,
    write_tiny_dduf,
    write_tiny_gguf,
    write_tiny_gguf_shards,
    write_tiny_safetensors_dir,
)

CREATED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
HEX = "0123456789abcdef" * 4
DIGEST = "sha256:" + HEX


def hand_artifact(layer_contents: list[bytes]) -> tuple[bytes, dict[str, bytes]]:
    """A manifest built by hand over tiny GGUF-typed layers: (manifest bytes, {digest: blob bytes})."""
    blobs: dict[str, bytes] = {}
    layers = []
    for i, content in enumerate(layer_contents):
        digest = sha256_digest(content)
        blobs[digest] = content
        annotations = {mt.ANNOTATION_FILEPATH: f"layer-{i}.gguf"}
        layers.append(Descriptor(mt.GGUF, digest, len(content), annotations))
    config = make_config_blob({"format": "gguf"}, [layer.digest for layer in layers], CREATED)
    config_digest = sha256_digest(config)
    blobs[config_digest] = config
    manifest = Manifest(Descriptor(mt.CONFIG_V01, config_digest, len(config)), tuple(layers))
    return manifest.to_bytes(), blobs


@pytest.fixture
def make_artifact() -> Callable[..., tuple[bytes, dict[str, bytes]]]:
    """`make_artifact([b"layer", ...])`: (manifest bytes, {digest: blob}), nothing written."""
    return hand_artifact


@pytest.fixture
def add_hand_model(store: ModelStore) -> Callable[..., str]:
    """Write hand-made blobs and a manifest into the store; returns the model ID."""

    def _add(layer_contents: list[bytes], tags: tuple[str, ...] = ()) -> str:
        manifest_bytes, blobs = hand_artifact(layer_contents)
        for data in blobs.values():
            store.write_blob_bytes(data)
        return store.add_model(manifest_bytes, tags)

    return _add


def index_models(store: ModelStore) -> list[dict[str, Any]]:
    models: list[dict[str, Any]] = json.loads(store.layout.index_file.read_text())["models"]
    return models


def blob_names(store: ModelStore) -> set[str]:
    return {path.name for path in store.layout.blobs_dir.iterdir()}


def hex_of(digest: str) -> str:
    return digest.removeprefix("sha256:")


# --- layout ------------------------------------------------------------------------------------------------


def test_new_store_creates_the_contract_layout(store: ModelStore) -> None:
    root = store.layout.root
    assert json.loads((root / "layout.json").read_text()) == {"version": "1.0.0"}
    assert json.loads((root / "models.json").read_text()) == {"models": []}
    for folder in ("blobs/sha256", "manifests/sha256", "bundles/sha256"):
        assert (root / folder).is_dir()
    assert stat.S_IMODE((root / "models.json").stat().st_mode) == 0o644


def test_reopening_a_store_keeps_its_models(store: ModelStore, tiny_model: str) -> None:
    reopened = ModelStore(store.layout.root)
    assert [model.id for model in reopened.list_models()] == [tiny_model]
    assert json.loads(store.layout.layout_file.read_text()) == {"version": "1.0.0"}


def test_layout_paths_follow_the_contract(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path)
    assert layout.blob_path(DIGEST) == tmp_path / "blobs" / "sha256" / HEX
    assert layout.incomplete_path(DIGEST) == tmp_path / "blobs" / "sha256" / f"{HEX}.incomplete"
    assert layout.manifest_path(DIGEST) == tmp_path / "manifests" / "sha256" / HEX
    assert layout.bundle_path(DIGEST) == tmp_path / "bundles" / "sha256" / HEX


BAD_DIGESTS = [
    "",
    HEX,
    "sha256:",
    "sha256:../../etc/passwd",
    "sha256:" + HEX.upper(),
    "sha256:" + HEX[:-1],
    "sha256:" + HEX + "0",
    "sha256:" + HEX[:-1] + "g",
    "sha512:" + HEX * 2,
    "SHA256:" + HEX,
    DIGEST + "\n",
    " " + DIGEST,
    DIGEST + "/x",
    "sha256:" + HEX[:12],
]


@pytest.mark.parametrize("digest", BAD_DIGESTS)
@pytest.mark.parametrize("method", ["blob_path", "incomplete_path", "manifest_path", "bundle_path"])
def test_layout_refuses_anything_but_a_sha256_digest(refuses: Any, digest: str, method: str) -> None:
    with refuses(InvalidDigest):
        getattr(StoreLayout(Path("/nonexistent")), method)(digest)


# --- fileio ------------------------------------------------------------------------------------------------


def test_write_file_atomic_replaces_the_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "data.json"
    write_file_atomic(target, b"first")
    write_file_atomic(target, b"second")
    assert target.read_bytes() == b"second"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["data.json"]


def test_hash_file_and_copy_and_hash_agree_with_hashlib(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000  # more than one 4 MiB chunk is not needed: several writes still happen
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    expected = ("sha256:" + hashlib.sha256(data).hexdigest(), len(data))
    assert hash_file(source) == expected
    assert copy_and_hash(source, tmp_path / "copy.bin") == expected
    assert (tmp_path / "copy.bin").read_bytes() == data


def test_copy_and_hash_of_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert copy_and_hash(tmp_path / "empty", tmp_path / "copy") == (sha256_digest(b""), 0)
    assert (tmp_path / "copy").read_bytes() == b""


@pytest.fixture(params=["worker", "inline", "mixed"])
def small_chunks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 4 KiB and a writeback every 16 KiB, so that small files take every turn of the loops;
    HashingWriter's writes all handed to its worker, all written inline, or chunks under 5000 bytes inline
    when no write is waiting."""
    monkeypatch.setattr(fileio, "CHUNK", 4096)
    monkeypatch.setattr(fileio, "WRITEBACK_STEP", 16384)
    inline_below = {"worker": 0, "inline": 1 << 30, "mixed": 5000}[request.param]
    monkeypatch.setattr(fileio, "INLINE_WRITE_BELOW", inline_below)


def random_file(path: Path, size: int) -> tuple[bytes, tuple[str, int]]:
    data = os.urandom(size)
    path.write_bytes(data)
    return data, (sha256_digest(data), size)


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 3 * 4096, 50_000])
def test_copy_and_hash_in_many_chunks(small_chunks: None, tmp_path: Path, size: int) -> None:
    data, expected = random_file(tmp_path / "source.bin", size)
    assert copy_and_hash(tmp_path / "source.bin", tmp_path / "copy.bin") == expected
    assert (tmp_path / "copy.bin").read_bytes() == data


@pytest.mark.parametrize("error", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL])
def test_copy_and_hash_reads_and_writes_where_the_kernel_cannot_copy(
    small_chunks: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    """copy_file_range refused between the two files (another file system, an old kernel): plain copy."""

    def refuse(*_: Any) -> int:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "copy_file_range", refuse)
    data, expected = random_file(tmp_path / "source.bin", 50_000)
    assert copy_and_hash(tmp_path / "source.bin", tmp_path / "copy.bin") == expected
    assert (tmp_path / "copy.bin").read_bytes() == data


def test_copy_and_hash_finishes_with_reads_when_the_kernel_copy_stops_early(
    small_chunks: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some file systems answer 0 (end of file) to copy_file_range before the end: the rest is read."""
    real = os.copy_file_range

    def stops_at_8k(source: int, dest: int, count: int, offset_src: int, offset_dst: int) -> int:
        return (
            0
            if offset_src >= 8192
            else real(source, dest, min(count, 8192 - offset_src), offset_src, offset_dst)
        )

    monkeypatch.setattr(os, "copy_file_range", stops_at_8k)
    data, expected = random_file(tmp_path / "source.bin", 50_000)
    assert copy_and_hash(tmp_path / "source.bin", tmp_path / "copy.bin") == expected
    assert (tmp_path / "copy.bin").read_bytes() == data


def test_copy_and_hash_removes_the_copy_when_the_copy_fails(
    small_chunks: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.copy_file_range

    def disk_full_after_8k(source: int, dest: int, count: int, offset_src: int, offset_dst: int) -> int:
        if offset_src >= 8192:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(source, dest, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", disk_full_after_8k)
    random_file(tmp_path / "source.bin", 50_000)
    with pytest.raises(OSError) as info:
        copy_and_hash(tmp_path / "source.bin", tmp_path / "copy.bin")
    assert info.value.errno == errno.ENOSPC
    assert not (tmp_path / "copy.bin").exists()


def test_hashing_writer_appends_in_order_and_hashes_what_it_wrote(small_chunks: None, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    sizes = [3000, 20_000, 100, 1, 70_000, 4999, 5000, 5001]
    fd = os.open(tmp_path / "out.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    hasher = hashlib.sha256(b"prefix")
    os.write(fd, b"prefix")
    try:
        with HashingWriter(fd, hasher, 6) as writer:
            start, turn = 0, 0
            while start < len(data):
                writer.write(data[start : start + sizes[turn % len(sizes)]])
                start += sizes[turn % len(sizes)]
                turn += 1
        assert writer.position == 6 + len(data)
    finally:
        os.close(fd)
    assert (tmp_path / "out.bin").read_bytes() == b"prefix" + data
    assert hasher.hexdigest() == hashlib.sha256(b"prefix" + data).hexdigest()


def test_hashing_writer_raises_a_failed_write(small_chunks: None, tmp_path: Path) -> None:
    fd = os.open(tmp_path / "out.bin", os.O_RDONLY | os.O_CREAT)  # writes fail with EBADF
    try:
        with pytest.raises(OSError) as info, HashingWriter(fd, hashlib.sha256(), 0) as writer:
            writer.write(b"x" * 10)
            writer.write(b"y" * 10)
        assert info.value.errno == errno.EBADF
    finally:
        os.close(fd)


def special_path(kind: str, tmp_path: Path) -> Path:
    """A path that is not a regular file: missing, a folder, a FIFO or a character device."""
    if kind == "missing":
        return tmp_path / "missing.bin"
    if kind == "directory":
        (tmp_path / "folder").mkdir()
        return tmp_path / "folder"
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe")
        return tmp_path / "pipe"
    if kind == "dangling symlink":
        (tmp_path / "link").symlink_to(tmp_path / "nowhere")
        return tmp_path / "link"
    assert kind == "device"
    return Path("/dev/null")


SPECIAL_KINDS = ["missing", "directory", "fifo", "dangling symlink", "device"]


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
@pytest.mark.parametrize("function", [require_regular_file, open_regular_file, hash_file])
def test_fileio_refuses_anything_but_a_regular_file(
    refuses: Any, tmp_path: Path, kind: str, function: Callable[..., Any]
) -> None:
    path = special_path(kind, tmp_path)
    with refuses(BadRequest) as info:
        function(path, "weights file")  # a FIFO would block a plain open(): it must be refused first
    assert "weights file" in info.value.message
    assert path.name in info.value.message


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_copy_and_hash_refuses_a_non_regular_source_and_creates_nothing(
    refuses: Any, tmp_path: Path, kind: str
) -> None:
    source = special_path(kind, tmp_path)
    with refuses(BadRequest):
        copy_and_hash(source, tmp_path / "copy.bin")
    assert not (tmp_path / "copy.bin").exists()


def test_copy_and_hash_never_deletes_an_existing_destination(tmp_path: Path) -> None:
    (tmp_path / "source.bin").write_bytes(b"new")
    (tmp_path / "dest.bin").write_bytes(b"precious")
    with pytest.raises(FileExistsError):
        copy_and_hash(tmp_path / "source.bin", tmp_path / "dest.bin")
    assert (tmp_path / "dest.bin").exists()
    assert (tmp_path / "dest.bin").read_bytes() == b"precious"


# --- writing blobs -----------------------------------------------------------------------------------------


def test_write_blob_stream_verifies_and_places_the_blob(store: ModelStore) -> None:
    data = b"a" * 1000 + b"b" * 1000
    digest = sha256_digest(data)
    assert store.write_blob_stream(digest, len(data), [data[:700], data[700:1500], data[1500:]]) is True
    assert store.layout.blob_path(digest).read_bytes() == data
    assert stat.S_IMODE(store.layout.blob_path(digest).stat().st_mode) == 0o644
    assert blob_names(store) == {hex_of(digest)}
    assert store.has_blob(digest, len(data))
    assert not store.has_blob(digest, len(data) + 1)


def test_write_blob_stream_of_a_present_blob_drains_the_chunks_and_returns_false(store: ModelStore) -> None:
    data = b"present"
    digest = store.write_blob_bytes(data)
    consumed: list[bytes] = []

    def chunks() -> Iterator[bytes]:
        for chunk in (b"pre", b"sent"):
            consumed.append(chunk)
            yield chunk

    assert store.write_blob_stream(digest, len(data), chunks()) is False
    assert consumed == [b"pre", b"sent"]
    assert blob_names(store) == {hex_of(digest)}


BAD_STREAMS = {
    "larger than declared": (b"hello world", 5),
    "shorter than declared": (b"hello", 11),
    "content does not match the digest": (b"hellO", 5),
    "empty": (b"", 5),
}


@pytest.mark.parametrize("case", BAD_STREAMS)
def test_write_blob_stream_refuses_bad_content_and_leaves_nothing(
    store: ModelStore, refuses: Any, case: str
) -> None:
    data, size = BAD_STREAMS[case]
    digest = sha256_digest(b"hello")
    with refuses(InvalidArtifact, store):
        store.write_blob_stream(digest, size, [data[:3], data[3:]])
    assert blob_names(store) == set()  # neither the blob nor its .incomplete


def test_write_blob_stream_removes_the_partial_when_the_source_fails(store: ModelStore) -> None:
    def dropped_connection() -> Iterator[bytes]:
        yield b"half a blob"
        raise ConnectionError("peer went away")

    with pytest.raises(ConnectionError):
        store.write_blob_stream(DIGEST, 100, dropped_connection())
    assert blob_names(store) == set()


@pytest.mark.parametrize("digest", ["sha256:../../../escape", "sha256:" + HEX.upper(), "md5:abc"])
def test_write_blob_stream_refuses_a_bad_digest(store: ModelStore, refuses: Any, digest: str) -> None:
    with refuses(InvalidDigest, store):
        store.write_blob_stream(digest, 1, [b"x"])


@pytest.mark.parametrize("other_writer_fails", [False, True], ids=["other-succeeds", "other-fails"])
def test_two_interleaved_writers_of_the_same_blob_both_end_well(
    store: ModelStore, other_writer_fails: bool
) -> None:
    data = b"x" * 1000 + b"y" * 1000
    digest = sha256_digest(data)

    def other_chunks() -> Iterator[bytes]:
        if other_writer_fails:
            raise ConnectionError("peer went away")
        yield data

    def chunks() -> Iterator[bytes]:  # another pull of the same blob runs while this one is half done
        yield data[:1000]
        with contextlib.suppress(ConnectionError):
            store.write_blob_stream(digest, len(data), other_chunks())
        yield data[1000:]

    store.write_blob_stream(digest, len(data), chunks())
    assert store.layout.blob_path(digest).read_bytes() == data
    assert blob_names(store) == {hex_of(digest)}


def test_a_verified_write_repairs_a_damaged_blob(store: ModelStore) -> None:
    data = b"the real content" * 64
    digest = sha256_digest(data)
    store.layout.blob_path(digest).write_bytes(data[:10])  # e.g. cut short by a full disk
    store.write_blob_stream(digest, len(data), [data])
    assert store.layout.blob_path(digest).read_bytes() == data


def test_write_blob_bytes_is_content_addressed_and_idempotent(store: ModelStore) -> None:
    digest = store.write_blob_bytes(b"config")
    assert digest == sha256_digest(b"config")
    assert store.write_blob_bytes(b"config") == digest
    assert blob_names(store) == {hex_of(digest)}
    assert store.read_blob(digest) == b"config"


def test_read_blob_refuses_a_blob_larger_than_asked(store: ModelStore, refuses: Any) -> None:
    digest = store.write_blob_bytes(b"0123456789")
    with refuses(InvalidArtifact, store):
        store.read_blob(digest, max_bytes=9)


def test_read_blob_of_a_missing_blob_is_store_corruption(store: ModelStore, refuses: Any) -> None:
    with refuses(StoreCorrupted, store):
        store.read_blob(DIGEST)


def test_ingest_file_deduplicates_identical_content(store: ModelStore, tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"same weights")
    (tmp_path / "b.gguf").write_bytes(b"same weights")
    first = store.ingest_file(tmp_path / "a.gguf")
    second = store.ingest_file(tmp_path / "b.gguf")
    assert first == second == (sha256_digest(b"same weights"), 12)
    assert blob_names(store) == {hex_of(first[0])}  # no stray .ingest- file either


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_ingest_file_refuses_a_non_regular_file(
    store: ModelStore, refuses: Any, tmp_path: Path, kind: str
) -> None:
    with refuses(BadRequest, store):
        store.ingest_file(special_path(kind, tmp_path), "GGUF file")


# --- adding models -----------------------------------------------------------------------------------------


def test_add_model_registers_the_manifest_digest_as_id(
    store: ModelStore, make_artifact: Callable[..., Any]
) -> None:
    manifest_bytes, blobs = make_artifact([b"weights"])
    for data in blobs.values():
        store.write_blob_bytes(data)
    model_id = store.add_model(manifest_bytes, ["ai/x"])
    assert model_id == sha256_digest(manifest_bytes)
    assert store.layout.manifest_path(model_id).read_bytes() == manifest_bytes
    layer_digest, config_digest = list(blobs)
    assert index_models(store) == [
        {"id": model_id, "tags": ["docker.io/ai/x:latest"], "files": [layer_digest, config_digest]}
    ]


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("x", "docker.io/ai/x:latest"),
        ("ai/x", "docker.io/ai/x:latest"),
        ("docker.io/ai/x:v1", "docker.io/ai/x:v1"),
        ("myorg/X:Q4_K_M", "docker.io/myorg/x:Q4_K_M"),
        ("hf.co/Org/Repo:Q4_K_M", "huggingface.co/org/repo:Q4_K_M"),  # tag case kept, as DMR
        ("localhost:5000/team/m", "localhost:5000/team/m:latest"),
    ],
)
def test_tags_are_stored_fully_qualified(
    store: ModelStore, add_hand_model: Callable[..., str], given: str, stored: str
) -> None:
    add_hand_model([b"weights"], (given,))
    assert index_models(store)[0]["tags"] == [stored]


def test_adding_the_same_model_again_merges_its_tags(store: ModelStore, add_hand_model: Any) -> None:
    first = add_hand_model([b"weights"], ("ai/a",))
    second = add_hand_model([b"weights"], ("ai/b", "ai/a"))
    assert first == second
    assert index_models(store) == [
        {
            "id": first,
            "tags": ["docker.io/ai/a:latest", "docker.io/ai/b:latest"],
            "files": index_models(store)[0]["files"],
        }
    ]


@pytest.mark.parametrize("missing", ["layer", "config"])
def test_add_model_refuses_a_manifest_whose_blobs_are_missing(
    store: ModelStore, refuses: Any, make_artifact: Callable[..., Any], missing: str
) -> None:
    manifest_bytes, blobs = make_artifact([b"weights"])
    layer_digest, config_digest = list(blobs)
    store.write_blob_bytes(blobs[config_digest if missing == "layer" else layer_digest])
    with refuses(InvalidArtifact, store):
        store.add_model(manifest_bytes, ["ai/x"])
    assert index_models(store) == []


def test_add_model_refuses_a_config_blob_that_is_not_a_config(store: ModelStore, refuses: Any) -> None:
    layer = store.write_blob_bytes(b"weights")
    config = store.write_blob_bytes(b"not json")
    manifest = Manifest(Descriptor(mt.CONFIG_V01, config, 8), (Descriptor(mt.GGUF, layer, 7),))
    with refuses(InvalidArtifact, store):
        store.add_model(manifest.to_bytes())


def test_add_model_refuses_an_invalid_manifest(store: ModelStore, refuses: Any) -> None:
    with refuses(InvalidArtifact, store):
        store.add_model(b'{"schemaVersion": 2, "layers": []}')


@pytest.mark.parametrize("tag", ["ai/x@" + DIGEST, "../x", "ai/X Y", "ai/x:-bad", "sha256:" + HEX])
def test_add_model_refuses_an_invalid_tag_before_writing_anything(
    store: ModelStore, refuses: Any, make_artifact: Callable[..., Any], tag: str
) -> None:
    manifest_bytes, blobs = make_artifact([b"weights"])
    for data in blobs.values():
        store.write_blob_bytes(data)
    with refuses(InvalidReference, store):
        store.add_model(manifest_bytes, ["ai/ok", tag])


# --- lookup ------------------------------------------------------------------------------------------------


def lookups(model_id: str) -> list[str]:
    hex_id = hex_of(model_id)
    return [
        "ai/tiny",
        "tiny",
        "tiny:latest",
        "  tiny  ",
        "docker.io/ai/tiny",
        "docker.io/ai/tiny:latest",
        model_id,
        hex_id,
        hex_id[:12],
        "sha256:" + hex_id[:12],
        "ai/tiny@" + model_id,
        "ai/anything@" + model_id,  # a digest reference names the model by its digest alone
    ]


def test_lookup_by_tag_name_id_short_id_and_digest_reference(store: ModelStore, tiny_model: str) -> None:
    for reference in lookups(tiny_model):
        assert store.get(reference).id == tiny_model, reference


def test_model_api_object_has_id_tags_created_and_config(store: ModelStore, tiny_model: str) -> None:
    api = store.get("tiny").to_api()
    assert api["id"] == tiny_model
    assert api["tags"] == ["docker.io/ai/tiny:latest"]
    assert api["created"] > 0
    assert api["config"]["format"] == "gguf"


@pytest.mark.parametrize(
    ("reference", "error"),
    [
        ("ai/other", ModelNotFound),
        ("tiny:v2", ModelNotFound),
        (HEX, ModelNotFound),
        (DIGEST, ModelNotFound),
        (HEX[:12], ModelNotFound),
        ("sha256:" + HEX[:12], ModelNotFound),
        ("ai/tiny@" + DIGEST, ModelNotFound),
        ("sha256:xyz", InvalidDigest),
        ("sha256:" + HEX.upper(), InvalidDigest),
        ("../tiny", InvalidReference),
        ("", InvalidReference),
        ("/abs/path", InvalidReference),
    ],
)
def test_lookup_of_an_unknown_or_invalid_reference_is_refused(
    store: ModelStore, tiny_model: str, refuses: Any, reference: str, error: type[Exception]
) -> None:
    with refuses(error, store):
        store.get(reference)


def test_an_ambiguous_short_id_is_a_conflict(store: ModelStore, tiny_model: str, refuses: Any) -> None:
    # Two IDs sharing 12 hex digits cannot be made by hashing; write the second index entry by hand.
    models = index_models(store)
    twin = {"id": tiny_model[:-4] + "ffff" if not tiny_model.endswith("ffff") else tiny_model[:-4] + "0000"}
    models.append(twin | {"tags": [], "files": []})
    write_file_atomic(store.layout.index_file, json.dumps({"models": models}).encode())
    short = hex_of(tiny_model)[:12]
    for reference in (short, "sha256:" + short):
        with refuses(Conflict, store) as info:
            store.get(reference)
        assert info.value.status_code == 409
    assert store.get(tiny_model).id == tiny_model  # the full ID still names one model


# --- tags --------------------------------------------------------------------------------------------------


def test_tagging_moves_a_tag_from_one_model_to_another(store: ModelStore, add_hand_model: Any) -> None:
    a = add_hand_model([b"model a"], ("ai/shared", "ai/a"))
    b = add_hand_model([b"model b"], ("ai/b",))
    assert store.tag("ai/b", "ai/shared") == "docker.io/ai/shared:latest"
    assert store.get("ai/shared").id == b
    assert store.get(a).tags == ["docker.io/ai/a:latest"]
    store.tag(b, "ai/a")
    assert store.get(a).tags == []  # A keeps existing, untagged
    assert {m.id for m in store.list_models()} == {a, b}


def test_tagging_from_a_model_given_by_id(store: ModelStore, tiny_model: str) -> None:
    store.tag(hex_of(tiny_model)[:12], "myorg/tiny:v1")
    assert store.get("myorg/tiny:v1").id == tiny_model
    assert store.get("ai/tiny").tags == ["docker.io/ai/tiny:latest", "docker.io/myorg/tiny:v1"]


@pytest.mark.parametrize(
    ("source", "target", "error"),
    [
        ("ai/missing", "ai/new", ModelNotFound),
        ("ai/tiny", "ai/new@" + DIGEST, InvalidReference),
        ("ai/tiny", "../new", InvalidReference),
        ("ai/tiny", "sha256:" + HEX, InvalidReference),
    ],
)
def test_tag_refuses_an_unknown_source_or_invalid_target(
    store: ModelStore, tiny_model: str, refuses: Any, source: str, target: str, error: type[Exception]
) -> None:
    with refuses(error, store):
        store.tag(source, target)


# --- delete ------------------------------------------------------------------------------------------------


def model_files(store: ModelStore, model_id: str) -> list[Path]:
    model = store.get(model_id)
    return [store.layout.manifest_path(model_id)] + [
        store.layout.blob_path(blob.digest) for blob in model.manifest.blobs
    ]


def test_delete_by_tag_only_untags_while_other_tags_remain(store: ModelStore, tiny_model: str) -> None:
    store.tag("ai/tiny", "ai/second")
    assert store.delete("tiny") == [{"Untagged": "docker.io/ai/tiny:latest"}]
    assert store.get(tiny_model).tags == ["docker.io/ai/second:latest"]
    assert all(path.exists() for path in model_files(store, tiny_model))


def test_delete_by_the_last_tag_deletes_the_model(store: ModelStore, tiny_model: str) -> None:
    files = model_files(store, tiny_model)
    bundle = store.bundle(tiny_model)
    assert store.delete("ai/tiny:latest") == [
        {"Untagged": "docker.io/ai/tiny:latest"},
        {"Deleted": tiny_model},
    ]
    assert index_models(store) == []
    assert not any(path.exists() for path in files)
    assert not bundle.exists()
    assert blob_names(store) == set()
    with pytest.raises(ModelNotFound):
        store.get(tiny_model)


def test_delete_by_id_of_a_model_with_two_tags_needs_force(
    store: ModelStore, tiny_model: str, refuses: Any
) -> None:
    store.tag("ai/tiny", "ai/second")
    for reference in (tiny_model, hex_of(tiny_model)[:12], "ai/tiny@" + tiny_model):
        with refuses(Conflict, store) as info:
            store.delete(reference)
        assert info.value.status_code == 409
        assert "force" in info.value.message
    events = store.delete(hex_of(tiny_model)[:12], force=True)
    assert events == [
        {"Untagged": "docker.io/ai/tiny:latest"},
        {"Untagged": "docker.io/ai/second:latest"},
        {"Deleted": tiny_model},
    ]
    assert index_models(store) == []
    assert blob_names(store) == set()


@pytest.mark.parametrize("tags", [(), ("ai/one",)], ids=["untagged", "one-tag"])
def test_delete_by_id_of_a_model_with_at_most_one_tag(
    store: ModelStore, add_hand_model: Any, tags: tuple[str, ...]
) -> None:
    model_id = add_hand_model([b"weights"], tags)
    events = store.delete(model_id)
    assert events[-1] == {"Deleted": model_id}
    assert index_models(store) == []


def test_deleting_one_of_two_models_keeps_their_shared_blob(
    store: ModelStore, package: Callable[..., str], tiny_gguf: Path, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "LICENSE").write_text("licence A\n")
    (tmp_path / "b" / "LICENSE").write_text("licence B\n")
    a = package(PackageSpec(gguf=tiny_gguf, licenses=[tmp_path / "a" / "LICENSE"]), ("ai/a",))
    b = package(PackageSpec(gguf=tiny_gguf, licenses=[tmp_path / "b" / "LICENSE"]), ("ai/b",))
    store.bundle(a)
    bundle_b = store.bundle(b)
    gguf_digest = store.get(a).manifest.layers[0].digest
    assert store.get(b).manifest.layers[0].digest == gguf_digest
    only_b = [blob.digest for blob in store.get(b).manifest.blobs if blob.digest != gguf_digest]
    assert len(only_b) == 2  # its licence and its config

    store.delete("ai/b")

    assert store.layout.blob_path(gguf_digest).read_bytes() == tiny_gguf.read_bytes()
    assert not any(store.layout.blob_path(d).exists() for d in only_b)
    assert not store.layout.manifest_path(b).exists()
    assert not bundle_b.exists()
    assert store.bundle(a).joinpath("model", "model.gguf").read_bytes() == tiny_gguf.read_bytes()
    assert blob_names(store) == {hex_of(blob.digest) for blob in store.get(a).manifest.blobs}


@pytest.mark.parametrize("reference", ["ai/missing", DIGEST, HEX[:12]])
def test_delete_of_an_unknown_model_is_refused(
    store: ModelStore, tiny_model: str, refuses: Any, reference: str
) -> None:
    with refuses(ModelNotFound, store):
        store.delete(reference)


def test_remove_unreferenced_blobs_keeps_blobs_a_model_uses(store: ModelStore, tiny_model: str) -> None:
    used = store.get(tiny_model).manifest.config.digest
    orphan = store.write_blob_bytes(b"left over by a failed package")
    store.remove_unreferenced_blobs([used, orphan, DIGEST])
    assert store.has_blob(used)
    assert not store.has_blob(orphan)


# --- repackage ---------------------------------------------------------------------------------------------


def test_repackage_writes_a_new_config_and_manifest_over_the_same_layers(
    store: ModelStore, tiny_model: str
) -> None:
    new_id = store.repackage("ai/tiny", "ai/tiny-8k", 8192)
    old, new = store.get(tiny_model), store.get(new_id)
    assert new_id != tiny_model
    assert new.manifest.layers == old.manifest.layers
    assert new.config.context_size == 8192
    assert old.config.context_size == 512
    assert new.tags == ["docker.io/ai/tiny-8k:latest"]


@pytest.mark.parametrize(
    ("source", "target", "context_size", "error"),
    [
        ("ai/missing", "ai/new", 8192, ModelNotFound),
        ("ai/tiny", "ai/new@" + DIGEST, None, InvalidReference),
        ("ai/tiny", "../new", 8192, InvalidReference),
    ],
)
def test_repackage_refuses_bad_input_and_changes_nothing(
    store: ModelStore,
    tiny_model: str,
    refuses: Any,
    source: str,
    target: str,
    context_size: int | None,
    error: type[Exception],
) -> None:
    with refuses(error, store):
        store.repackage(source, target, context_size)


def test_repackage_of_a_cncf_model_with_a_context_size_is_refused(store: ModelStore, refuses: Any) -> None:
    layer = store.write_blob_bytes(b"weights")
    config = json.dumps({"config": {"format": "gguf"}}).encode()
    config_digest = store.write_blob_bytes(config)
    manifest = Manifest(
        Descriptor(mt.CONFIG_CNCF, config_digest, len(config)), (Descriptor(mt.CNCF_WEIGHT_GGUF, layer, 7),)
    )
    model_id = store.add_model(manifest.to_bytes(), ["ai/cncf"])
    with refuses(BadRequest, store):
        store.repackage(model_id, "ai/cncf-8k", 8192)


@pytest.mark.parametrize(
    ("config_media_type", "artifact_type", "config"),
    [
        # the manifest says so by its artifactType alone
        (mt.CONFIG_V01, mt.CNCF_MANIFEST_ARTIFACT_TYPE, {"config": {"format": "gguf"}}),
        # the config says so alone (modelpack.is_modelpack_config), under a Docker media type
        (mt.CONFIG_V01, None, {"config": {"paramSize": "1B"}, "modelfs": {"type": "layers", "diffIds": []}}),
    ],
)
def test_repackage_refuses_every_model_the_modelpack_rule_names(
    store: ModelStore, refuses: Any, config_media_type: str, artifact_type: str | None, config: dict[str, Any]
) -> None:
    layer = store.write_blob_bytes(b"weights")
    blob = json.dumps(config).encode()
    manifest = Manifest(
        Descriptor(config_media_type, store.write_blob_bytes(blob), len(blob)),
        (Descriptor(mt.GGUF, layer, 7),),
        artifact_type=artifact_type,
    )
    model_id = store.add_model(manifest.to_bytes(), ["ai/modelpack"])
    assert store.get(model_id).is_modelpack
    with refuses(BadRequest, store):
        store.repackage(model_id, "ai/modelpack-8k", 8192)


# --- purge -------------------------------------------------------------------------------------------------


def test_purge_wipes_everything_and_reinitialises(
    store: ModelStore, tiny_model: str, take_snapshot: Callable[[Path], Any], tmp_path: Path
) -> None:
    store.bundle(tiny_model)
    empty = take_snapshot(ModelStore(tmp_path / "fresh").layout.root)
    store.purge()
    assert take_snapshot(store.layout.root) == empty
    assert store.list_models() == []
    with pytest.raises(ModelNotFound):
        store.get(tiny_model)


def test_purge_refuses_a_folder_without_layout_json(store: ModelStore, tiny_model: str, refuses: Any) -> None:
    store.layout.layout_file.unlink()
    with refuses(Conflict, store) as info:
        store.purge()
    assert "layout.json" in info.value.message
    assert store.get(tiny_model).id == tiny_model


# --- stale partials and corruption -------------------------------------------------------------------------


def test_stale_partials_are_removed_at_init_and_fresh_ones_kept(store: ModelStore) -> None:
    blobs = store.layout.blobs_dir
    now = time.time()
    stale = blobs / f"{'a' * 64}.incomplete"
    fresh = blobs / f"{'b' * 64}.incomplete"
    stale_ingest = blobs / ".ingest-0123"
    fresh_ingest = blobs / ".ingest-4567"
    for path in (stale, fresh, stale_ingest, fresh_ingest):
        path.write_bytes(b"partial")
    os.utime(stale, (now - INCOMPLETE_MAX_AGE - 3600,) * 2)
    os.utime(fresh, (now - INCOMPLETE_MAX_AGE + 3600,) * 2)
    os.utime(stale_ingest, (now - STRAY_INGEST_IDLE - 3600,) * 2)
    ModelStore(store.layout.root)
    assert not stale.exists()
    assert not stale_ingest.exists()
    assert fresh.exists()
    assert fresh_ingest.exists()


def test_copies_left_by_a_killed_writer_are_removed_at_init_and_those_being_written_kept(
    store: ModelStore,
) -> None:
    """A kill -9 during `package` or `load` leaves a `.ingest-`/`.load-` copy nobody can finish: the next
    open removes it once nothing writes it (no writer's lock, no recent byte), not a day later."""
    blobs = store.layout.blobs_dir
    idle = time.time() - STRAY_INGEST_IDLE - 60
    orphans = [blobs / ".ingest-0123", blobs / ".load-4567"]
    fresh, locked = blobs / ".load-89ab", blobs / ".ingest-cdef"
    for path in (*orphans, fresh, locked):
        path.write_bytes(b"partial")
    for path in (*orphans, locked):
        os.utime(path, (idle, idle))
    with open(locked, "rb") as writer:  # a writer at work in another process holds this lock
        fcntl.flock(writer, fcntl.LOCK_EX)
        ModelStore(store.layout.root)
        assert locked.exists() and fresh.exists()
    assert not any(path.exists() for path in orphans)


def test_a_blob_being_streamed_is_not_taken_for_a_stray(store: ModelStore) -> None:
    data = b"weights" * 1000
    digest = "sha256:" + hashlib.sha256(data).hexdigest()

    def chunks() -> Iterator[bytes]:
        yield data[:10]
        [partial] = store.layout.blobs_dir.glob(".load-*")
        os.utime(partial, (0, 0))  # as if it had stalled for ever: only its writer's lock keeps it
        ModelStore(store.layout.root)
        assert partial.exists()
        yield data[10:]

    assert store.write_blob_stream(digest, len(data), chunks())
    assert store.read_blob(digest) == data


def test_adopting_a_downloaded_file_moves_it_into_the_blobs(store: ModelStore) -> None:
    store.layout.downloads_dir.mkdir()
    first, second = store.layout.downloads_dir / "a.bin", store.layout.downloads_dir / "b.bin"
    first.write_bytes(b"weights")
    second.write_bytes(b"weights")
    expected = "sha256:" + hashlib.sha256(b"weights").hexdigest()
    assert store.adopt_file(first) == (expected, 7)  # hashed here
    assert not first.exists() and store.read_blob(expected) == b"weights"
    assert store.adopt_file(second, expected) == (expected, 7)  # digest known from the download
    assert not second.exists() and store.read_blob(expected) == b"weights"


def test_partial_downloads_are_removed_a_week_after_their_last_byte(store: ModelStore) -> None:
    downloads = store.layout.downloads_dir
    now = time.time()
    old_stamp = (now - INCOMPLETE_MAX_AGE - 3600,) * 2
    stale, active = downloads / "hf-stale", downloads / "hf-active"
    for folder in (stale, active):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "a.gguf.incomplete").write_bytes(b"partial")
        (folder / "done.json").write_bytes(b"{}")
    for path in (stale / "sub" / "a.gguf.incomplete", stale / "sub", stale / "done.json", stale):
        os.utime(path, old_stamp)
    for path in (active / "done.json", active / "sub", active):
        os.utime(path, old_stamp)  # old folder, but a byte written an hour ago
    lock = downloads / "hf-stale.lock"
    lock.write_bytes(b"")
    os.utime(lock, old_stamp)
    ModelStore(store.layout.root)
    assert not stale.exists() and not lock.exists()
    assert (active / "sub" / "a.gguf.incomplete").exists()


def test_store_init_survives_a_blob_folder_entry_that_vanishes(store: ModelStore) -> None:
    # A dangling symlink fails stat() exactly as a file renamed by another process after the listing does.
    (store.layout.blobs_dir / ".ingest-racing").symlink_to(store.layout.blobs_dir / "renamed-meanwhile")
    ModelStore(store.layout.root)


CORRUPT_INDEXES = [
    pytest.param(b"{not json", id="not-json"),
    pytest.param(b"[]", id="a-list"),
    pytest.param(b'{"models": [1]}', id="entry-not-an-object"),
    pytest.param(b'{"models": [{"tags": []}]}', id="entry-without-id"),
    pytest.param(b'{"models": "abc"}', id="models-a-string"),
    pytest.param(b'{"models": [{"id": "sha256:x", "tags": 5}]}', id="tags-not-a-list"),
    pytest.param(
        json.dumps({"models": [{"id": DIGEST, "tags": [], "files": []}]}).encode(), id="manifest-missing"
    ),
    pytest.param(b'{"models": [{"id": "../../etc/passwd", "tags": [], "files": []}]}', id="id-not-a-digest"),
]


@pytest.mark.parametrize("content", CORRUPT_INDEXES)
def test_a_corrupted_models_json_is_store_corruption(store: ModelStore, refuses: Any, content: bytes) -> None:
    write_file_atomic(store.layout.index_file, content)
    with refuses(StoreCorrupted, store) as info:
        store.list_models()
    assert info.value.status_code == 500


# --- cross-process lock ------------------------------------------------------------------------------------


def _add_models_in_a_process(
    root: str, barrier: Any, artifacts: list[tuple[bytes, dict[str, bytes], str]]
) -> None:
    store = ModelStore(Path(root))
    barrier.wait()  # all four processes hit the index at the same time
    for manifest_bytes, blobs, tag in artifacts:
        for data in blobs.values():
            store.write_blob_bytes(data)
        store.add_model(manifest_bytes, [tag])


def test_four_processes_adding_models_at_once_lose_none(
    store: ModelStore, make_artifact: Callable[..., Any]
) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    jobs = []
    expected: dict[str, str] = {}
    for worker in range(4):
        artifacts = []
        for i in range(5):
            manifest_bytes, blobs = make_artifact([f"worker {worker} model {i}".encode()])
            tag = f"ai/w{worker}-m{i}"
            artifacts.append((manifest_bytes, blobs, tag))
            expected[sha256_digest(manifest_bytes)] = f"docker.io/{tag}:latest"
        jobs.append(
            ctx.Process(target=_add_models_in_a_process, args=(str(store.layout.root), barrier, artifacts))
        )
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(timeout=300)
    assert [job.exitcode for job in jobs] == [0, 0, 0, 0]
    models = index_models(store)
    assert len(models) == 20
    assert {m["id"]: m["tags"] for m in models} == {k: [v] for k, v in expected.items()}
    assert len(store.list_models()) == 20


# --- bundles -----------------------------------------------------------------------------------------------


def bundle_files(bundle: Path) -> set[str]:
    return {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}


def assert_hard_links(store: ModelStore, model_id: str, bundle: Path) -> None:
    """Every file under model/ is the same inode as a blob of the model."""
    blob_inodes = {
        os.stat(store.layout.blob_path(blob.digest)).st_ino for blob in store.get(model_id).manifest.layers
    }
    for path in (bundle / "model").rglob("*"):
        if path.is_file():
            assert os.stat(path).st_ino in blob_inodes, path.name


def test_bundle_of_a_single_gguf(store: ModelStore, tiny_model: str, tiny_gguf: Path) -> None:
    bundle = store.bundle("ai/tiny")
    assert bundle == store.layout.bundle_path(tiny_model)
    assert bundle_files(bundle) == {"config.json", "model/model.gguf"}
    assert (bundle / "model" / "model.gguf").read_bytes() == tiny_gguf.read_bytes()
    assert json.loads((bundle / "config.json").read_text()) == store.get(tiny_model).config.config
    assert_hard_links(store, tiny_model, bundle)
    gguf_blob = store.layout.blob_path(store.get(tiny_model).manifest.layers[0].digest)
    assert os.stat(bundle / "model" / "model.gguf").st_ino == os.stat(gguf_blob).st_ino


def test_bundle_of_a_shard_set_numbers_the_shards(
    store: ModelStore, package: Callable[..., str], tmp_path: Path
) -> None:
    (tmp_path / "shards").mkdir()
    shards = write_tiny_gguf_shards(tmp_path / "shards", n=2)
    model_id = package(PackageSpec(gguf=shards[1]))
    bundle = store.bundle(model_id)
    assert bundle_files(bundle) == {
        "config.json",
        "model/model-00001-of-00002.gguf",
        "model/model-00002-of-00002.gguf",
    }
    for i, shard in enumerate(shards, 1):
        assert (bundle / "model" / f"model-{i:05d}-of-00002.gguf").read_bytes() == shard.read_bytes()
    assert_hard_links(store, model_id, bundle)


def test_bundle_places_chat_template_and_mmproj(
    store: ModelStore, package: Callable[..., str], tiny_gguf: Path, tmp_path: Path
) -> None:
    template = tmp_path / "src" / "my-template.jinja"
    template.write_text(CHAT_TEMPLATE)
    mmproj = write_tiny_gguf(tmp_path / "src" / "mmproj-f16.gguf", seed=7)
    license_file = tmp_path / "src" / "LICENSE"
    license_file.write_text("MIT\n")
    model_id = package(
        PackageSpec(gguf=tiny_gguf, chat_template=template, mmproj=mmproj, licenses=[license_file])
    )
    bundle = store.bundle(model_id)
    assert bundle_files(bundle) == {
        "config.json",
        "model/model.gguf",
        "model/model.mmproj",
        "model/template.jinja",
    }
    assert (bundle / "model" / "template.jinja").read_text() == CHAT_TEMPLATE
    assert (bundle / "model" / "model.mmproj").read_bytes() == mmproj.read_bytes()
    assert_hard_links(store, model_id, bundle)


def test_bundle_of_a_safetensors_folder_keeps_relative_paths(
    store: ModelStore, package: Callable[..., str], tmp_path: Path
) -> None:
    folder = write_tiny_safetensors_dir(tmp_path / "hf")
    model_id = package(PackageSpec(safetensors_dir=folder))
    bundle = store.bundle(model_id)
    assert bundle_files(bundle) == {
        "config.json",
        "model/model.safetensors",
        "model/config.json",
        "model/tokenizer.json",
        "model/tokenizer_config.json",
        "model/chat_template.jinja",
        "model/LICENSE",
        "model/sub/extra.txt",
    }
    assert (bundle / "model" / "sub" / "extra.txt").read_text() == "a nested file\n"
    assert (bundle / "model" / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    runtime = json.loads((bundle / "config.json").read_text())
    assert runtime["format"] == "safetensors"
    assert runtime == store.get(model_id).config.config
    assert_hard_links(store, model_id, bundle)


def test_bundle_of_a_dduf_keeps_its_file_name(
    store: ModelStore, package: Callable[..., str], tmp_path: Path
) -> None:
    dduf = write_tiny_dduf(tmp_path / "tiny-pipeline.dduf")
    model_id = package(PackageSpec(dduf=dduf))
    bundle = store.bundle(model_id)
    assert bundle_files(bundle) == {"config.json", "model/tiny-pipeline.dduf"}
    assert json.loads((bundle / "config.json").read_text())["format"] == "dduf"
    assert_hard_links(store, model_id, bundle)


# ModelPack (CNCF) models: weights are `weight.v1.raw` whatever their format; DMR's bundle
# (internal/bundle/unpack.go: UnpackFromLayers, updateBundleFieldsFromLayer; parse.go) tells them apart by
# the config's format and by file names (`mmproj`, `*.jinja`).


def test_bundle_of_a_cncf_gguf_places_weights_projector_and_template_by_role(
    store: ModelStore, package: Callable[..., str], tiny_gguf: Path, tmp_path: Path
) -> None:
    # follows internal/bundle/unpack_test.go: TestUnpackFromLayers_CNCFModelWithMMProj
    template = tmp_path / "src" / "my-template.jinja"
    template.write_text(CHAT_TEMPLATE)
    mmproj = write_tiny_gguf(tmp_path / "src" / "mmproj-f16.gguf", seed=7)
    license_file = tmp_path / "src" / "LICENSE"
    license_file.write_text("MIT\n")
    model_id = package(
        PackageSpec(
            gguf=tiny_gguf, chat_template=template, mmproj=mmproj, licenses=[license_file], format="cncf"
        )
    )
    manifest = store.get(model_id).manifest
    assert manifest.artifact_type == mt.CNCF_MANIFEST_ARTIFACT_TYPE
    assert [layer.media_type for layer in manifest.layers] == [
        mt.CNCF_WEIGHT_RAW,
        mt.CNCF_DOC_RAW,
        mt.CNCF_WEIGHT_CONFIG_RAW,
        mt.CNCF_WEIGHT_RAW,
    ]
    bundle = store.bundle(model_id)
    assert bundle_files(bundle) == {
        "config.json",
        "model/model.gguf",
        "model/model.mmproj",
        "model/template.jinja",
    }
    assert (bundle / "model" / "model.gguf").read_bytes() == tiny_gguf.read_bytes()
    assert (bundle / "model" / "model.mmproj").read_bytes() == mmproj.read_bytes()
    assert (bundle / "model" / "template.jinja").read_text() == CHAT_TEMPLATE
    assert json.loads((bundle / "config.json").read_text())["format"] == "gguf"
    assert_hard_links(store, model_id, bundle)


def test_bundle_of_a_cncf_shard_set_numbers_the_shards(
    store: ModelStore, package: Callable[..., str], tmp_path: Path
) -> None:
    (tmp_path / "shards").mkdir()
    shards = write_tiny_gguf_shards(tmp_path / "shards", n=2)
    model_id = package(PackageSpec(gguf=shards[0], format="cncf"))
    bundle = store.bundle(model_id)
    assert bundle_files(bundle) == {
        "config.json",
        "model/model-00001-of-00002.gguf",
        "model/model-00002-of-00002.gguf",
    }
    for i, shard in enumerate(shards, 1):
        assert (bundle / "model" / f"model-{i:05d}-of-00002.gguf").read_bytes() == shard.read_bytes()


def _modelpack_model(
    store: ModelStore,
    config: dict[str, Any],
    files: list[tuple[str, str | None]],
    config_media_type: str = mt.CONFIG_CNCF,
    artifact_type: str | None = mt.CNCF_MANIFEST_ARTIFACT_TYPE,
) -> str:
    """A ModelPack model as another tool (modctl) writes it: raw layers, file path annotations."""
    layers = []
    for media_type, path in files:
        data = f"{media_type} {path}".encode()
        annotations = {mt.ANNOTATION_FILEPATH: path} if path else {}
        layers.append(Descriptor(media_type, store.write_blob_bytes(data), len(data), annotations))
    blob = json.dumps(
        {"modelfs": {"type": "layers", "diffIds": [x.digest for x in layers]}, **config}
    ).encode()
    manifest = Manifest(
        Descriptor(config_media_type, store.write_blob_bytes(blob), len(blob)),
        tuple(layers),
        artifact_type=artifact_type,
    )
    return store.add_model(manifest.to_bytes())


def test_bundle_of_a_cncf_gguf_without_a_format_in_its_config(store: ModelStore) -> None:
    # follows internal/bundle/unpack.go: inferFormatFromLayerAnnotations, isMMProjFilePath; parse.go:
    # findGGUFFile skips mmproj files
    model_id = _modelpack_model(
        store,
        {"config": {"paramSize": "1b"}},
        [
            (mt.CNCF_DOC_RAW, "README.md"),
            (mt.CNCF_WEIGHT_RAW, "mmproj-BF16.gguf"),
            (mt.CNCF_WEIGHT_RAW, "qwen-Q4_K_M.gguf"),
            (mt.CNCF_WEIGHT_CONFIG_RAW, "chat_template.jinja"),
            (mt.CNCF_WEIGHT_RAW, "extra.gguf"),  # not the model's shard set: not the model
        ],
    )
    model = store.get(model_id)
    assert model.config.format == "gguf" and "format" not in model.config.config
    bundle = store.bundle(model_id)
    assert bundle_files(bundle) == {
        "config.json",
        "model/model.gguf",
        "model/model.mmproj",
        "model/template.jinja",
    }
    assert (
        bundle / "model" / "model.gguf"
    ).read_bytes() == b"%s qwen-Q4_K_M.gguf" % mt.CNCF_WEIGHT_RAW.encode()


def test_bundle_of_a_model_only_its_config_calls_modelpack_is_laid_out_by_role(store: ModelStore) -> None:
    # one rule (modelpack.is_modelpack_model): a ModelPack config under a Docker media type and no
    # artifactType is still a ModelPack model, so its raw weights are placed by role
    model_id = _modelpack_model(
        store,
        {"config": {"paramSize": "1b", "format": "gguf"}},
        [(mt.CNCF_WEIGHT_RAW, "qwen-Q4_K_M.gguf")],
        config_media_type=mt.CONFIG_V01,
        artifact_type=None,
    )
    assert bundle_files(store.bundle(model_id)) == {"config.json", "model/model.gguf"}


def test_bundle_of_a_cncf_safetensors_folder_keeps_relative_paths(
    store: ModelStore, package: Callable[..., str], tmp_path: Path
) -> None:
    # follows internal/bundle/unpack.go: UnpackFromLayers (CNCF models are laid out by their file paths)
    folder = write_tiny_safetensors_dir(tmp_path / "hf")
    model_id = package(PackageSpec(safetensors_dir=folder, format="cncf"))
    bundle = store.bundle(model_id)
    assert bundle_files(bundle) == {
        "config.json",
        "model/model.safetensors",
        "model/config.json",
        "model/tokenizer.json",
        "model/tokenizer_config.json",
        "model/chat_template.jinja",
        "model/LICENSE",
        "model/sub/extra.txt",
    }
    assert json.loads((bundle / "config.json").read_text())["format"] == "safetensors"
    assert_hard_links(store, model_id, bundle)


def test_bundle_of_cncf_weights_without_paths_gets_v01_names(store: ModelStore) -> None:
    # DMR skips layers without a path; a weight still needs a place for the engine to find it
    model_id = _modelpack_model(
        store,
        {"config": {"format": "safetensors", "paramSize": "1"}},
        [(mt.CNCF_WEIGHT_RAW, None), (mt.CNCF_WEIGHT_CONFIG_RAW, "config.json"), (mt.CNCF_DOC_RAW, None)],
    )
    assert bundle_files(store.bundle(model_id)) == {
        "config.json",
        "model/model.safetensors",
        "model/config.json",
    }


def test_bundle_of_a_cncf_dduf_keeps_its_file_name(
    store: ModelStore, package: Callable[..., str], tmp_path: Path
) -> None:
    dduf = write_tiny_dduf(tmp_path / "tiny-pipeline.dduf")
    model_id = package(PackageSpec(dduf=dduf, format="cncf"))
    bundle = store.bundle(model_id)
    assert bundle_files(bundle) == {"config.json", "model/tiny-pipeline.dduf"}
    assert store.get(model_id).config.format == "dduf"


def test_a_second_bundle_call_reuses_the_bundle(store: ModelStore, tiny_model: str) -> None:
    first = store.bundle(tiny_model)
    marker = first / "marker"
    marker.write_text("built once")
    config_inode = os.stat(first / "config.json").st_ino
    assert store.bundle("ai/tiny") == first
    assert marker.read_text() == "built once"
    assert os.stat(first / "config.json").st_ino == config_inode
    assert [p.name for p in store.layout.bundles_dir.iterdir()] == [hex_of(tiny_model)]  # no staging left


def test_a_bundle_without_its_config_json_is_rebuilt(store: ModelStore, tiny_model: str) -> None:
    bundle = store.bundle(tiny_model)
    (bundle / "config.json").unlink()  # e.g. a crash or a user cleaning up by hand
    assert store.bundle(tiny_model) == bundle
    assert (bundle / "config.json").is_file()
    assert json.loads((bundle / "config.json").read_text()) == store.get(tiny_model).config.config


def test_bundle_of_an_unknown_model_is_refused(store: ModelStore, tiny_model: str, refuses: Any) -> None:
    with refuses(ModelNotFound, store):
        store.bundle("ai/unknown")


def _v02_model(store: ModelStore, paths: list[str]) -> str:
    layers = []
    for path in paths:
        digest = store.write_blob_bytes(path.encode())
        layers.append(Descriptor(mt.MODEL_FILE, digest, len(path), {mt.ANNOTATION_FILEPATH: path}))
    weights = store.write_blob_bytes(b"weights")
    layers.append(Descriptor(mt.SAFETENSORS, weights, 7, {mt.ANNOTATION_FILEPATH: "model.safetensors"}))
    config = json.dumps({"config": {"format": "safetensors"}}).encode()
    config_digest = store.write_blob_bytes(config)
    manifest = Manifest(Descriptor(mt.CONFIG_V02, config_digest, len(config)), tuple(layers))
    return store.add_model(manifest.to_bytes())


@pytest.mark.parametrize("paths", [["a", "a/b"], ["a/b", "a"]], ids=["file-first", "folder-first"])
def test_layers_whose_paths_collide_as_file_and_folder_are_refused(
    store: ModelStore, paths: list[str]
) -> None:
    """A file `a` and a file `a/b` cannot both exist in a bundle: such a manifest is not accepted."""
    with pytest.raises(InvalidArtifact, match="lies under another layer"):
        _v02_model(store, paths)
    assert store.list_models() == []
