"""DMR's tar export/load format (contract 3.6): `blobs/sha256/<hex>` entries, then `manifest.json`."""

from __future__ import annotations

import contextlib
import re
import tarfile
from collections.abc import Iterable, Iterator
from typing import IO

from modelrunner.artifact.manifest import MAX_MANIFEST_BYTES
from modelrunner.artifact.tar_stream import file_chunks, tar_chunks
from modelrunner.errors import InvalidArtifact
from modelrunner.store.store import ModelStore

READ_CHUNK = 1024 * 1024
_BLOB_NAME = re.compile(r"blobs/sha256/([0-9a-f]{64})")
_ALLOWED_DIRS = {"blobs", "blobs/sha256"}


def export_chunks(store: ModelStore, reference: str) -> Iterator[bytes]:
    """Stream a model as a tar: its blobs, then its manifest."""
    model = store.get(reference)
    manifest_bytes = store.read_manifest(model.id)
    entries: list[tuple[str, int, Iterable[bytes]]] = [
        (
            f"blobs/sha256/{blob.digest.removeprefix('sha256:')}",
            blob.size,
            file_chunks(store.layout.blob_path(blob.digest)),
        )
        for blob in model.manifest.blobs
    ]
    entries.append(("manifest.json", len(manifest_bytes), [manifest_bytes]))
    return tar_chunks(entries)


def _member_chunks(handle: IO[bytes]) -> Iterator[bytes]:
    while chunk := handle.read(READ_CHUNK):
        yield chunk


def load_archive(store: ModelStore, stream: IO[bytes]) -> str:
    """Read a model tar from a stream into the store; returns the model ID (registered untagged).

    Every blob is digest-verified as it is written. On any failure, the blobs this load added are
    removed again, so a bad archive leaves the store as it was.
    """
    added: list[str] = []
    manifest_bytes: bytes | None = None
    try:
        try:
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                for member in archive:
                    name = member.name.removeprefix("./").rstrip("/")
                    if member.isdir() and name in _ALLOWED_DIRS:
                        continue
                    if not member.isreg():
                        raise InvalidArtifact(f"archive entry {name[:80]!r} is not a regular file")
                    handle = archive.extractfile(member)
                    if handle is None:
                        raise InvalidArtifact(f"archive entry {name[:80]!r} cannot be read")
                    blob = _BLOB_NAME.fullmatch(name)
                    if blob:
                        digest = "sha256:" + blob.group(1)
                        if store.write_blob_stream(digest, member.size, _member_chunks(handle)):
                            added.append(digest)
                    elif name == "manifest.json":
                        if member.size > MAX_MANIFEST_BYTES:
                            raise InvalidArtifact("manifest.json in the archive is too large")
                        manifest_bytes = handle.read()
                    else:
                        raise InvalidArtifact(f"unexpected archive entry {name[:80]!r}")
        except (tarfile.TarError, EOFError):
            raise InvalidArtifact("the archive is not a valid model tar") from None
        if manifest_bytes is None:
            raise InvalidArtifact("the archive has no manifest.json")
        model_id = store.add_model(manifest_bytes)
    except BaseException:
        with contextlib.suppress(Exception):
            store.remove_unreferenced_blobs(added)
        raise
    store.remove_unreferenced_blobs(added)  # extra entries the manifest does not list
    return model_id
