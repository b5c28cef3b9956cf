"""The local model store: content-addressed blobs, manifests, the models index, tags and bundles.

Layout and invariants follow DMR (contract section 4, `pkg/distribution/internal/store`), plus an
inter-process lock around every index change, which DMR lacks. Tags are stored in DMR's form
(`docker.io/ai/x:latest`, Hugging Face tags in their own case) and matched as DMR's index does: by parsed
reference, so `x`, `ai/x:latest` and `index.docker.io/ai/x` find the same model whatever spelling the
index holds. A store an earlier modelrunner wrote (`index.docker.io/...` tags, lowercased Hugging Face
tags) is rewritten to that form when opened (`_migrate_tags`). The store knows nothing of the network.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from modelrunner import config as runner_config
from modelrunner.artifact import modelpack
from modelrunner.artifact.manifest import Descriptor, Manifest, parse_manifest, sha256_digest
from modelrunner.artifact.model_config import ModelConfig, parse_config_blob, with_context_size
from modelrunner.digest import validate_digest
from modelrunner.errors import (
    BadRequest,
    Conflict,
    InvalidArtifact,
    InvalidDigest,
    InvalidReference,
    ModelNotFound,
    StoreCorrupted,
    UnsupportedMediaType,
    is_no_space,
)
from modelrunner.eventlog import event
from modelrunner.fileio import (
    HashingWriter,
    copy_and_hash,
    fsync_dir,
    hash_file,
    write_file_atomic,
)
from modelrunner.reference import Reference, parse_model_id, parse_reference
from modelrunner.store.bundle import build_bundle
from modelrunner.store.layout import LAYOUT_VERSION, StoreLayout

log = logging.getLogger(__name__)

INCOMPLETE_MAX_AGE = 7 * 24 * 3600
STRAY_INGEST_IDLE = 60.0  # seconds without a change after which an unlocked copy has no writer left
CHUNK_SIZE = 4 * 1024 * 1024  # reads of a partial download when resuming it


@dataclass
class IndexEntry:
    id: str
    tags: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "tags": self.tags, "files": self.files}


@dataclass(frozen=True)
class StoredModel:
    id: str
    tags: list[str]
    manifest: Manifest
    config: ModelConfig

    @property
    def is_modelpack(self) -> bool:
        return modelpack.is_modelpack_model(self.manifest, self.config.modelpack)

    def to_api(self) -> dict[str, Any]:
        """The `Model` object of DMR's API: {id, tags, created, config}."""
        return {
            "id": self.id,
            "tags": self.tags,
            "created": self.config.created,
            "config": self.config.config,
        }


def _index_entry(raw: Any) -> IndexEntry:
    """One models.json entry, checked: a broken index is the store's fault, not the request's."""
    tags, files = raw.get("tags") or [], raw.get("files") or []
    if not isinstance(tags, list) or not isinstance(files, list):
        raise ValueError("tags and files must be lists")
    if not all(isinstance(t, str) for t in tags):
        raise ValueError("tags must be strings")
    return IndexEntry(
        id=validate_digest(str(raw["id"])), tags=list(tags), files=[validate_digest(f) for f in files]
    )


def full_tag(text: str) -> str:
    ref = parse_reference(text)
    if ref.digest:
        raise InvalidReference("a tag cannot contain a digest")
    return str(ref)


@functools.lru_cache(maxsize=4096)
def _parsed_tag(tag: str, default_registry: str) -> Reference | None:
    try:
        return parse_reference(tag, default_registry)
    except InvalidReference:
        return None


def tag_reference(tag: str) -> Reference | None:
    """A stored tag, parsed as a lookup compares it (None for one that does not parse: DMR skips those)."""
    return _parsed_tag(tag, runner_config.default_registry())


def _same_tag(stored: str, ref: Reference) -> bool:
    return stored == str(ref) or tag_reference(stored) == ref


def _recover_tag_case(tag: str, manifest: Manifest, config: ModelConfig | None) -> str:
    """The spelling of a Hugging Face tag that an earlier modelrunner stored lowercased (`q4_k_m`), found
    in the model's own file names (`Model-Q4_K_M.gguf`) or quantization; unchanged when neither has it."""
    name, _, lowered = tag.rpartition(":")
    if not lowered or lowered != lowered.lower() or lowered == "latest":
        return tag
    pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(lowered)}(?![A-Za-z0-9])", re.IGNORECASE)
    candidates = [layer.filepath.rsplit("/", 1)[-1] for layer in manifest.layers if layer.filepath]
    if config is not None:
        candidates.append(str(config.config.get("quantization", "")).removeprefix("MOSTLY_"))
    for text in candidates:
        match = pattern.search(text)
        if match:
            return f"{name}:{match.group(0)}"
    return tag


class ModelStore:
    def __init__(self, root: Path) -> None:
        self.layout = StoreLayout(root)
        self._thread_lock = threading.RLock()
        self._cache: dict[str, tuple[Manifest, ModelConfig]] = {}
        # the index as last read: its file's stamp, its entries, and get()'s answers from them by reference
        # (kept with the entries they came from, so that a lookup made as the index changes cannot outlive it)
        self._index_cache: tuple[tuple[int, int, int], list[IndexEntry], dict[str, IndexEntry]] | None = None
        self._index_path = str(self.layout.index_file)  # stat'ed on every lookup: a str is the cheapest
        self._init_layout()

    # -- layout ---------------------------------------------------------------------------------

    def _init_layout(self) -> None:
        layout = self.layout
        for folder in (layout.blobs_dir, layout.manifests_dir, layout.bundles_dir, layout.configs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        if not layout.layout_file.exists():  # as DMR writes it: json.MarshalIndent of Layout
            write_file_atomic(layout.layout_file, json.dumps({"version": LAYOUT_VERSION}, indent=2).encode())
        # Only modelrunner makes the lock file: with it there and no marker, an earlier version wrote here.
        opened_before = layout.lock_file.exists()
        with self._locked():
            for stray in layout.root.glob(f".{layout.index_file.name}.*.tmp"):
                with contextlib.suppress(OSError):  # from a writer killed mid-write (writers hold the lock)
                    stray.unlink()
            if not layout.index_file.exists():
                self._write_index([])
            if not layout.tags_marker.exists():
                try:
                    self._migrate_tags(recover_case=opened_before)
                    write_file_atomic(layout.tags_marker, b"tags in DMR's form (docker.io/..., case kept)\n")
                except OSError as exc:  # lookups match the old tags too: go on, migrate on the next open
                    event(log, "store_migration_failed", logging.WARNING, error=exc.strerror or str(exc))
        self._remove_stale_partials()

    def _migrate_tags(self, recover_case: bool) -> None:
        """Rewrite tags an earlier modelrunner stored (`index.docker.io/...`, `hf.co/...`, and with
        `recover_case` Hugging Face tags it lowercased) in DMR's form, under the lock, once (the marker
        file says it is done: a tag a user later types lowercase stays lowercase, as in DMR). models.json
        is replaced in one atomic rename and the marker is written after it, so an interrupted migration
        leaves the old index whole and the next open does it again. A DMR store (tags already in DMR's
        form) keeps its models.json byte for byte."""
        try:
            entries = self._read_index()
        except StoreCorrupted:
            return  # reported, with its message, by the first read
        changed = False
        seen: set[Reference] = set()
        for entry in entries:
            tags: list[str] = []
            for tag in entry.tags:
                ref = tag_reference(tag)
                new = tag if ref is None or ref.digest else str(ref)
                if recover_case and ref is not None and ref.is_huggingface:
                    new = self._recovered_case(entry.id, new)
                new_ref = tag_reference(new)
                if new_ref is not None and new_ref in seen:
                    changed = True  # the same tag twice: lookups only ever found the first
                    continue
                if new_ref is not None:
                    seen.add(new_ref)
                changed |= new != tag
                tags.append(new)
            entry.tags = tags
        if changed:
            self._write_index(entries)

    def _recovered_case(self, model_id: str, tag: str) -> str:
        try:
            manifest, model_config = self._load(model_id)
        except (StoreCorrupted, InvalidArtifact, InvalidDigest, UnsupportedMediaType):
            return tag
        return _recover_tag_case(tag, manifest, model_config)

    def _remove_stale_partials(self) -> None:
        now = time.time()
        for path in self.layout.blobs_dir.iterdir():
            try:
                age = now - path.lstat().st_mtime
            except FileNotFoundError:
                continue  # renamed or removed by another process meanwhile
            stale_download = path.suffix == ".incomplete" and age > INCOMPLETE_MAX_AGE
            # a copy (package, load) whose writer died (kill -9) can never be finished: gone as soon as
            # nothing writes it (its writer's lock is free and its bytes stopped changing)
            stale_ingest = (
                path.name.startswith((".ingest-", ".load-"))
                and age > STRAY_INGEST_IDLE
                and not _being_written(path)
            )
            if stale_download or stale_ingest:
                with contextlib.suppress(OSError):
                    path.unlink()
        if self.layout.downloads_dir.is_dir():
            for folder in self.layout.downloads_dir.iterdir():
                if now - _newest_mtime(folder) > INCOMPLETE_MAX_AGE:
                    if folder.is_dir() and not folder.is_symlink():
                        shutil.rmtree(folder, ignore_errors=True)
                    else:
                        with contextlib.suppress(OSError):
                            folder.unlink()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise index changes between threads and between processes sharing the store."""
        with self._thread_lock, FileLock(str(self.layout.lock_file), timeout=60):
            yield

    # -- index ----------------------------------------------------------------------------------

    def _read_index(self) -> list[IndexEntry]:
        """The index (copies: callers may change them), re-read only when the file changed."""
        entries, _ = self._current_index()
        return [IndexEntry(e.id, list(e.tags), list(e.files)) for e in entries]

    def _current_index(self) -> tuple[list[IndexEntry], dict[str, IndexEntry]]:
        """The index as cached and the lookups made in it, after one stat to see that the file did not
        change (lookups sit on the inference path); not to be changed."""
        try:
            st = os.stat(self._index_path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if self._index_cache is not None and self._index_cache[0] == stamp:
                return self._index_cache[1], self._index_cache[2]
            doc = json.loads(self.layout.index_file.read_bytes())
            entries = [_index_entry(m) for m in doc.get("models") or []]
        except FileNotFoundError:
            self._index_cache = None
            return [], {}
        except (ValueError, TypeError, KeyError, AttributeError, InvalidDigest):
            raise StoreCorrupted("the models index (models.json) is corrupted") from None
        found: dict[str, IndexEntry] = {}
        self._index_cache = (stamp, entries, found)
        return entries, found

    def _write_index(self, entries: list[IndexEntry]) -> None:
        doc = {"models": [entry.to_json() for entry in entries]}
        write_file_atomic(self.layout.index_file, json.dumps(doc, indent=2).encode())

    def _find(self, entries: list[IndexEntry], text: str) -> IndexEntry:
        text = text.strip()
        model_id = parse_model_id(text)
        if model_id is not None:
            matches = [e for e in entries if e.id.startswith(model_id)]
            if len(matches) > 1:
                raise Conflict(f"short ID {text} matches more than one model; use more digits")
            if matches:
                return matches[0]
            if text.startswith("sha256:") or len(text) == 64:
                raise ModelNotFound(f"model not found: {text}")
        ref = parse_reference(text)
        for entry in entries:  # as DMR's IndexEntry.MatchesReference: the digest is the ID, a tag parsed
            if ref.digest and entry.id == ref.digest:
                return entry
            if not ref.digest and any(_same_tag(tag, ref) for tag in entry.tags):
                return entry
        raise ModelNotFound(f"model not found: {text[:200]}")

    @staticmethod
    def _find_by_name(entries: list[IndexEntry], text: str) -> IndexEntry:
        """DMR's fallback when a lookup by reference found nothing, for inspect and tag only
        (`pkg/inference/models/http_handler.go` findModelByPartialName, `manager.go` Tag): the first model,
        in store order, with a stored tag whose last path component, without its tag, is exactly `text`
        (`repo-gguf` finds `hf.co/org/repo-gguf:Q4_K_M`; `repo-gguf:Q4_K_M` does not)."""
        for entry in entries:
            for tag in entry.tags:
                name = tag.rpartition(":")[0] or tag
                if name.rpartition("/")[2] == text:
                    return entry
        raise ModelNotFound(f"model not found: {text[:200]}")

    # -- reading --------------------------------------------------------------------------------

    def _load(self, model_id: str) -> tuple[Manifest, ModelConfig]:
        cached = self._cache.get(model_id)
        if cached is None:
            manifest = parse_manifest(self.read_manifest(model_id))
            config = parse_config_blob(
                self.read_blob(manifest.config.digest),
                manifest.config.media_type,
                [(layer.media_type, layer.filepath) for layer in manifest.layers],
            )
            cached = (manifest, config)
            self._cache[model_id] = cached
        return cached

    def _stored(self, entry: IndexEntry) -> StoredModel:
        manifest, config = self._load(entry.id)
        return StoredModel(id=entry.id, tags=list(entry.tags), manifest=manifest, config=config)

    def list_models(self) -> list[StoredModel]:
        # the cached entries themselves, not _read_index's copies: _stored copies what it keeps (its tags)
        return [self._stored(entry) for entry in self._current_index()[0]]

    def get(self, reference: str, *, by_name: bool = False) -> StoredModel:
        """`by_name`: also DMR's last resort of inspect (`_find_by_name`)."""
        entries, found = self._current_index()  # one stat when unchanged: then the lookup is remembered
        entry = found.get(reference)
        if entry is None:
            try:
                entry = self._find(entries, reference)
            except ModelNotFound:
                if not by_name:
                    raise
                return self._stored(self._find_by_name(entries, reference))
            if len(found) < 1024:
                found[reference] = entry
        return self._stored(entry)

    def read_manifest(self, model_id: str) -> bytes:
        try:
            return self.layout.manifest_path(model_id).read_bytes()
        except FileNotFoundError:
            raise StoreCorrupted(f"manifest of model {model_id[:19]} is missing from the store") from None

    def read_blob(self, digest: str, max_bytes: int = 16 * 1024 * 1024) -> bytes:
        path = self.layout.blob_path(digest)
        try:
            with open(path, "rb") as handle:
                data = handle.read(max_bytes + 1)
        except FileNotFoundError:
            raise StoreCorrupted(f"blob {digest[:19]} is missing from the store") from None
        if len(data) > max_bytes:
            raise InvalidArtifact(f"blob {digest[:19]} is too large to read into memory")
        return data

    def has_blob(self, digest: str, size: int | None = None) -> bool:
        try:
            st = self.layout.blob_path(digest).stat()
        except FileNotFoundError:
            return False
        return size is None or st.st_size == size

    def disk_usage(self) -> int:
        total = 0
        for folder in (self.layout.blobs_dir, self.layout.manifests_dir):
            for path in folder.iterdir():
                with contextlib.suppress(OSError):
                    total += path.stat().st_size
        return total

    # -- writing blobs --------------------------------------------------------------------------

    def _place_blob(self, tmp: Path, digest: str) -> None:
        final = self.layout.blob_path(digest)
        if final.exists() and final.stat().st_size == tmp.stat().st_size:
            tmp.unlink()  # same content, already there (content addressed)
            return
        os.chmod(tmp, 0o644)  # a damaged blob of the wrong size is replaced by the verified copy
        os.replace(tmp, final)
        fsync_dir(final.parent)

    def ingest_file(self, path: Path, what: str = "file") -> tuple[str, int]:
        """Copy a user's file into the store, hashing while copying (one read pass)."""
        tmp = self.layout.blobs_dir / f".ingest-{uuid.uuid4().hex}"
        digest, size = copy_and_hash(path, tmp, what)
        self._place_blob(tmp, digest)
        return digest, size

    def adopt_file(self, path: Path, digest: str | None = None, what: str = "file") -> tuple[str, int]:
        """Move a file the store downloaded itself (under downloads/, so on the same filesystem) into the
        blobs instead of copying it; hashed here unless the download already did (`digest`)."""
        if digest is None:
            digest, size = hash_file(path, what)
        else:
            size = path.stat().st_size
        try:
            self._place_blob(path, digest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:  # downloads/ mounted elsewhere: copy after all
                raise
            return self.ingest_file(path, what)
        return digest, size

    def write_blob_bytes(self, data: bytes) -> str:
        digest = sha256_digest(data)
        if not self.has_blob(digest, len(data)):
            write_file_atomic(self.layout.blob_path(digest), data)
        return digest

    def write_blob_stream(self, digest: str, size: int, chunks: Iterable[bytes]) -> bool:
        """Stream a blob of known digest and size into the store, verified before it is placed.

        Returns False when the blob was already present (the chunks are then drained unread). Each call
        writes its own temporary file, so concurrent writers of one blob cannot disturb each other. On any
        error the temporary file is removed; a size or digest mismatch raises InvalidArtifact.
        """
        if self.has_blob(digest, size):
            for _ in chunks:
                pass
            return False
        tmp = self.layout.blobs_dir / f".load-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # while it is written: the clean-up of partials leaves it
            self._fill(fd, digest, size, 0, hashlib.sha256(), chunks)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        self._place_blob(tmp, digest)
        return True

    def partial_blob_size(self, digest: str) -> int:
        """Bytes already in `<hex>.incomplete` from an interrupted download (0 when there is none)."""
        try:
            return self.layout.incomplete_path(digest).stat().st_size
        except FileNotFoundError:
            return 0

    def discard_partial_blob(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.layout.incomplete_path(digest).unlink()

    def resume_blob_stream(self, digest: str, size: int, offset: int, chunks: Iterable[bytes]) -> None:
        """Continue `<hex>.incomplete` at `offset` (0 starts over) with `chunks`, then verify and place it.

        One writer per partial file at a time (an exclusive lock on it, across threads and processes); a
        writer that finds the blob placed meanwhile stops there. The kept prefix is hashed first, so the
        whole file is verified; a size or digest mismatch deletes the partial and raises InvalidArtifact.
        Any other error (the network, a cancellation) keeps what was written, flushed, for the next resume.
        """
        partial = self.layout.incomplete_path(digest)
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self.has_blob(digest, size):
                return
            if os.fstat(fd).st_size < offset:
                raise InvalidArtifact(f"partial download of blob {digest[:19]} is shorter than expected")
            os.ftruncate(fd, offset)
            hasher = hashlib.sha256()
            done = 0
            while done < offset:
                block = os.pread(fd, min(CHUNK_SIZE, offset - done), done)
                if not block:
                    break
                hasher.update(block)
                done += len(block)
            os.lseek(fd, offset, os.SEEK_SET)
            self._fill(fd, digest, size, offset, hasher, chunks)
            self._place_blob(partial, digest)
        except InvalidArtifact:
            partial.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

    @staticmethod
    def _fill(fd: int, digest: str, size: int, written: int, hasher: Any, chunks: Iterable[bytes]) -> None:
        """Append chunks to fd, hashing them after the `written` bytes already hashed; then verify.

        The hash and the write of each chunk overlap (HashingWriter). What was handed in is written and
        fsynced even when the producer fails (a cut download keeps its bytes for the resume).
        """
        try:
            with HashingWriter(fd, hasher, written) as writer:
                for chunk in chunks:
                    if writer.position + len(chunk) > size:
                        raise InvalidArtifact(f"blob {digest[:19]} is larger than its declared size")
                    writer.write(chunk)
            written = writer.position
        finally:
            os.fsync(fd)
        if written != size:
            raise InvalidArtifact(f"blob {digest[:19]} is shorter than its declared size")
        if "sha256:" + hasher.hexdigest() != digest:
            raise InvalidArtifact(f"blob {digest[:19]} does not match its digest")

    # -- models ---------------------------------------------------------------------------------

    def referenced_blobs(self) -> set[str]:
        return {digest for entry in self._read_index() for digest in entry.files}

    def add_model(self, manifest_bytes: bytes, tags: Iterable[str] = ()) -> str:
        """Register a model whose blobs are all in the store; returns its ID (the manifest digest)."""
        manifest = parse_manifest(manifest_bytes)
        for blob in manifest.blobs:
            if not self.has_blob(blob.digest, blob.size):
                raise InvalidArtifact(
                    f"blob {blob.digest[:19]} of the model is missing or has the wrong size"
                )
        parse_config_blob(self.read_blob(manifest.config.digest), manifest.config.media_type)
        model_id = sha256_digest(manifest_bytes)
        normalised = [full_tag(tag) for tag in tags]
        with self._locked():
            manifest_path = self.layout.manifest_path(model_id)
            if not manifest_path.exists():
                write_file_atomic(manifest_path, manifest_bytes)
            entries = self._read_index()
            entry = next((e for e in entries if e.id == model_id), None)
            if entry is None:
                entry = IndexEntry(id=model_id, files=[b.digest for b in manifest.blobs])
                entries.append(entry)
            self._move_tags(entries, entry, normalised)
            self._write_index(entries)
        return model_id

    @staticmethod
    def _move_tags(entries: list[IndexEntry], target: IndexEntry, tags: list[str]) -> None:
        """A tag names one model: tagging B with A's tag takes it from A (A stays, maybe untagged)."""
        for tag in tags:
            ref = parse_reference(tag)
            for other in entries:
                if other is not target:
                    other.tags = [t for t in other.tags if not _same_tag(t, ref)]
            if not any(_same_tag(t, ref) for t in target.tags):
                target.tags.append(tag)

    def tag(self, source: str, target: str) -> str:
        tag = full_tag(target)
        with self._locked():
            entries = self._read_index()
            try:
                entry = self._find(entries, source)
            except ModelNotFound:
                entry = self._find_by_name(entries, source)
            self._move_tags(entries, entry, [tag])
            self._write_index(entries)
        return tag

    def delete(self, reference: str, force: bool = False) -> list[dict[str, str]]:
        """`rm`: by tag, untag (and delete with the last tag); by ID, delete (409 if tagged many times)."""
        text = reference.strip()
        with self._locked():
            entries = self._read_index()
            entry = self._find(entries, text)
            model_id = parse_model_id(text)
            if model_id is not None and entry.id.startswith(model_id):
                by_id = True
            else:
                by_id = parse_reference(text).digest is not None
            events: list[dict[str, str]] = []
            if by_id:
                if len(entry.tags) > 1 and not force:
                    raise Conflict(
                        f"unable to delete {text[:80]} (must be forced) due to multiple tag references: "
                        + ", ".join(entry.tags)
                    )
                events += [{"Untagged": tag} for tag in entry.tags]
                entry.tags.clear()
            else:
                tag = full_tag(text)
                ref = parse_reference(tag)
                entry.tags = [t for t in entry.tags if not _same_tag(t, ref)]
                events.append({"Untagged": tag})
            if not entry.tags:
                entries.remove(entry)
                try:
                    self._write_index(entries)
                except OSError as exc:
                    if not is_no_space(exc):
                        raise
                    # A full disk has no room for the new index: the model's files go first, to make that
                    # room (were the write to fail still, the entry is left without files; rm again ends it).
                    event(log, "store_full_delete", logging.WARNING, model=entry.id)
                    self._remove_model_files(entry, entries)
                    self._write_index(entries)
                else:
                    self._remove_model_files(entry, entries)
                events.append({"Deleted": entry.id})
            else:
                self._write_index(entries)
        return events

    def _remove_model_files(self, entry: IndexEntry, remaining: list[IndexEntry]) -> None:
        """Called after the index no longer lists `entry`: remove what only it used."""
        still_used = {digest for other in remaining for digest in other.files}
        with contextlib.suppress(FileNotFoundError):
            self.layout.manifest_path(entry.id).unlink()
        shutil.rmtree(self.layout.bundle_path(entry.id), ignore_errors=True)
        shutil.rmtree(self.layout.kv_cache_path(entry.id), ignore_errors=True)  # its saved prompt caches
        for digest in entry.files:
            if digest not in still_used:
                with contextlib.suppress(FileNotFoundError):
                    self.layout.blob_path(digest).unlink()
        self._cache.pop(entry.id, None)

    def remove_unreferenced_blobs(self, digests: Iterable[str]) -> None:
        """Undo blobs written by a failed operation, unless some model uses them."""
        with self._locked():
            used = self.referenced_blobs()
            for digest in digests:
                if digest not in used:
                    with contextlib.suppress(FileNotFoundError):
                        self.layout.blob_path(digest).unlink()

    def repackage(self, source: str, target: str, context_size: int | None) -> str:
        """New config and manifest over the same blobs (DMR's lightweight repackage, `RepackageModel`):
        the config re-encoded with the context size set, the manifest rebuilt as Go writes it (OCI media
        type, the same layers). Without a context size it is the same model, tagged once more."""
        full_tag(target)  # a bad target fails before anything is written
        model = self.get(source)
        if model.is_modelpack:
            raise BadRequest("context size cannot be set on a CNCF-format model")
        if context_size is None:
            self.tag(model.id, target)
            return model.id
        config_bytes = with_context_size(self.read_blob(model.manifest.config.digest), context_size)
        config_digest = self.write_blob_bytes(config_bytes)
        old = model.manifest
        manifest = Manifest(
            config=Descriptor(old.config.media_type, config_digest, len(config_bytes)), layers=old.layers
        )
        return self.add_model(manifest.to_bytes(), [target])

    def bundle(self, reference: str) -> Path:
        return self.bundle_of(self.get(reference))

    def bundle_of(self, model: StoredModel) -> Path:
        """The model's bundle folder (built if missing), for a model already looked up."""
        return build_bundle(
            self.layout,
            model.id,
            model.manifest,
            model.config.config,
            model.config.format,
            model.is_modelpack,
        )

    def purge(self) -> None:
        """Delete every model and blob; refuses on a folder that is not a store."""
        if not self.layout.layout_file.is_file():
            raise Conflict(
                "refusing to purge: the models folder has no layout.json, so it is not a model store"
            )
        with self._locked():
            for child in self.layout.root.iterdir():
                if child == self.layout.lock_file:
                    continue
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            self._cache.clear()
        self._init_layout()


def _being_written(path: Path) -> bool:
    """Whether a writer holds the lock on the partial file `path` (ModelStore.write_blob_stream, and
    fileio.copy_and_hash, lock their file while they write it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _newest_mtime(path: Path) -> float:
    """The latest change under `path` (a partial download's age is that of its newest byte)."""
    try:
        newest = path.lstat().st_mtime
        if path.is_dir() and not path.is_symlink():
            for child in path.rglob("*"):
                newest = max(newest, child.lstat().st_mtime)
    except OSError:
        return time.time()  # changing right now: not stale
    return newest
