"""The builder's BlobSinks for the store: files are copied in while hashed (or, for files the store
downloaded itself, moved in), and what was added is remembered so that a failed build can be undone
(remove_unreferenced_blobs)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from modelrunner.store.store import ModelStore


class StoreSink:
    def __init__(self, store: ModelStore) -> None:
        self.store = store
        self.added: list[str] = []

    def add_file(self, path: Path, what: str) -> tuple[str, int]:
        digest, size = self.store.ingest_file(path, what)
        if digest not in self.added:
            self.added.append(digest)
        return digest, size

    def add_bytes(self, data: bytes) -> str:
        digest = self.store.write_blob_bytes(data)
        if digest not in self.added:
            self.added.append(digest)
        return digest


class AdoptingStoreSink(StoreSink):
    """For files in the store's downloads/ folder: moved into the blobs rather than copied, so a pull
    never holds two copies, using the digests computed while downloading (keys: resolved paths)."""

    def __init__(self, store: ModelStore, digests: Mapping[Path, str]) -> None:
        super().__init__(store)
        self.digests = digests

    def add_file(self, path: Path, what: str) -> tuple[str, int]:
        digest, size = self.store.adopt_file(path, self.digests.get(path.resolve()), what)
        if digest not in self.added:
            self.added.append(digest)
        return digest, size
