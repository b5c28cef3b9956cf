"""DMR's tar export/load format (contract 3.6): `blobs/sha256/<hex>` entries, then `manifest.json`.

Loading reads tars as DMR's reader does (`pkg/distribution/tarball/reader.go`): regular files named
`blobs/<algorithm>/<hex>` (or `manifests/...`) are blobs, `manifest.json` is the manifest, and anything
else (folders, links, other files, a README) is skipped. What stays strict: a name that is absolute or
has a `..` component, a sha256 blob whose name is not 64 lowercase hex, and a second manifest.json are
refused; blobs of other algorithms are skipped (only sha256 digests are stored), and every blob is
verified against its digest as it is written.
"""

from __future__ import annotations

import contextlib
import posixpath
import re
import tarfile
from collections.abc import Iterable, Iterator
from typing import IO

from modelrunner.artifact.manifest import MAX_MANIFEST_BYTES
from modelrunner.artifact.tar_stream import file_chunks, tar_chunks
from modelrunner.errors import InvalidArtifact
from modelrunner.store.store import ModelStore

READ_CHUNK = 1024 * 1024
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BLOB_FOLDERS = ("blobs", "manifests")  # DMR's reader takes both as blobs


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


def _entry_kind(raw_name: str) -> tuple[str, str | None]:
    """("manifest", None), ("blob", digest) or ("skip", None) for an archive entry's name; raises for an
    unsafe name or a malformed sha256 blob name."""
    shown = raw_name[:80]
    if raw_name.startswith("/") or "\\" in raw_name or ".." in raw_name.split("/"):
        raise InvalidArtifact(f"archive entry {shown!r} has an unsafe path")
    name = posixpath.normpath(raw_name)
    if name == "manifest.json":
        return "manifest", None
    parts = name.split("/")
    if len(parts) != 3 or parts[0] not in _BLOB_FOLDERS:
        return "skip", None
    if parts[1] != "sha256":
        return "skip", None  # another algorithm: nothing this store can verify or keep
    if not _HEX64.fullmatch(parts[2]):
        raise InvalidArtifact(f"archive entry {shown!r} is not named by a sha256 digest")
    return "blob", "sha256:" + parts[2]


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
                    kind, digest = _entry_kind(member.name)
                    if not member.isreg() or kind == "skip":
                        continue  # nothing is ever written from an entry's name, so skipping is safe
                    handle = archive.extractfile(member)
                    if handle is None:
                        raise InvalidArtifact(f"archive entry {member.name[:80]!r} cannot be read")
                    if digest is not None:
                        if store.write_blob_stream(digest, member.size, _member_chunks(handle)):
                            added.append(digest)
                    else:
                        if manifest_bytes is not None:
                            raise InvalidArtifact("the archive has more than one manifest.json")
                        if member.size > MAX_MANIFEST_BYTES:
                            raise InvalidArtifact("manifest.json in the archive is too large")
                        manifest_bytes = handle.read()
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
