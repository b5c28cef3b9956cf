"""Saved prompt caches (warm resume): where a runner's saved slots live in the store, under what
fingerprint, and how much disk they may take.

Layout, in the store's cache folder (store/layout.py `kv_cache_dir`):
  <model hex>/<fingerprint>/slot-<n>.bin ... manifest.json   one entry: the slots one runner saved
  .work/<runner tag>/                                        a runner's own save folder (the engine's)
An entry is a folder renamed into place whole, its manifest written last inside it: a reader sees a
complete entry or none. The manifest's modification time is the entry's last use (least recently used
entries go first when the byte budget is exceeded). Everything here is plain file work, run in a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from modelrunner.digest import validate_digest
from modelrunner.engines.base import SavedSlot
from modelrunner.eventlog import event
from modelrunner.fileio import fsync_dir, link_or_copy, write_file_atomic
from modelrunner.scheduler.memory import env_bytes
from modelrunner.store.layout import StoreLayout

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
WORK = ".work"
ENV_MAX = "MODEL_RUNNER_KV_CACHE_MAX"
FREE_DISK_SHARE = 0.10  # default budget: this share of the disk space free (or already used by entries)


def fingerprint(model_id: str, engine_identity: str) -> str:
    """What names a saved cache: the model and everything of the engine's run that makes a KV cache valid
    (engines/base.py `Engine.kv_identity`: its build, context size, slots, cache types, draft, ...)."""
    text = json.dumps([validate_digest(model_id), engine_identity])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    model_id: str
    fingerprint: str
    folder: Path
    slots: tuple[SavedSlot, ...]

    @property
    def size(self) -> int:
        return sum(slot.bytes for slot in self.slots)


def _folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


class KvStore:
    def __init__(self, layout: StoreLayout, max_bytes: int | None = None) -> None:
        self.layout = layout
        self.root = layout.kv_cache_dir
        self.max_bytes = max_bytes if max_bytes is not None else self.budget_from_env()

    def budget_from_env(self) -> int:
        """`MODEL_RUNNER_KV_CACHE_MAX` (e.g. 20GB), else a tenth of the free disk (plus what entries use)."""
        probe = self.root if self.root.exists() else self.root.parent
        while not probe.exists():
            probe = probe.parent
        usage = shutil.disk_usage(probe)
        return env_bytes(ENV_MAX, int((usage.free + self.disk_usage()) * FREE_DISK_SHARE))

    def _model_dir(self, model_id: str) -> Path:
        return self.layout.kv_cache_path(model_id)

    # -- a runner's own save folder ------------------------------------------------------------------

    def work_area(self, tag: str) -> Path:
        """A fresh, private folder the engine saves into and restores from (same file system as the
        entries, so a save becomes an entry by renames)."""
        folder = self.root / WORK / tag
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, mode=0o700)
        return folder

    def sweep(self) -> None:
        """Leftovers of a daemon that died: save folders and half-made entries."""
        shutil.rmtree(self.root / WORK, ignore_errors=True)
        for partial in self.root.glob("*/.*.tmp"):
            shutil.rmtree(partial, ignore_errors=True)

    # -- entries -------------------------------------------------------------------------------------

    def entry(self, model_id: str, fp: str) -> Entry | None:
        """The complete entry saved under `fp`, or None (a manifest that does not match its files is
        no entry: it is removed)."""
        folder = self._model_dir(model_id) / fp
        try:
            data = json.loads((folder / MANIFEST).read_text())
            slots = tuple(SavedSlot(**{**raw, "prompt": tuple(raw["prompt"])}) for raw in data["slots"])
            complete = data["fingerprint"] == fp and all(
                (folder / s.filename).stat().st_size == s.bytes for s in slots
            )
        except FileNotFoundError:
            if folder.exists():
                self.drop(model_id, fp, "incomplete")
            return None
        except (OSError, ValueError, KeyError, TypeError):
            complete = False
        if not complete:
            self.drop(model_id, fp, "unreadable")
            return None
        return Entry(model_id, fp, folder, slots)

    def commit(self, model_id: str, fp: str, work: Path, slots: list[SavedSlot]) -> Entry | None:
        """Make the slots the engine saved into `work` the entry `fp` (replacing an older one), then keep
        to the budget. None when nothing was saved or the entry alone is over the budget."""
        size = sum(slot.bytes for slot in slots)
        if not slots or size > self.max_bytes:
            if slots:
                event(log, "kv_save_skipped", model=model_id, reason="over_budget", bytes=size)
            return None
        model_dir = self._model_dir(model_id)
        model_dir.mkdir(parents=True, exist_ok=True)
        staging = model_dir / f".{fp}.{uuid.uuid4().hex[:8]}.tmp"
        staging.mkdir(mode=0o700)
        try:
            for slot in slots:
                os.replace(work / slot.filename, staging / slot.filename)
                with open(staging / slot.filename, "rb") as handle:
                    os.fsync(handle.fileno())
            slot_list = [asdict(slot) for slot in slots]
            manifest = {"fingerprint": fp, "model": model_id, "saved": time.time(), "slots": slot_list}
            write_file_atomic(staging / MANIFEST, json.dumps(manifest).encode(), mode=0o600)
            final = model_dir / fp
            if final.exists():
                old = model_dir / f".{fp}.{uuid.uuid4().hex[:8]}.tmp"
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(staging, final)
            fsync_dir(model_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.enforce_budget()
        return self.entry(model_id, fp)

    def link_into(self, entry: Entry, work: Path) -> None:
        """Put the entry's slot files where the engine restores from (hard links: no copy)."""
        for slot in entry.slots:
            target = work / slot.filename
            target.unlink(missing_ok=True)
            link_or_copy(entry.folder / slot.filename, target)

    def touch(self, entry: Entry) -> None:
        with contextlib.suppress(OSError):
            os.utime(entry.folder / MANIFEST)

    def drop(self, model_id: str, fp: str, reason: str) -> None:
        folder = self._model_dir(model_id) / fp
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
            event(log, "kv_entry_removed", model=model_id, fingerprint=fp[:12], reason=reason)

    def remove_model(self, model_id: str) -> None:
        shutil.rmtree(self._model_dir(model_id), ignore_errors=True)

    def entries(self) -> list[tuple[float, Path, int]]:
        """(last use, folder, bytes) of every complete entry."""
        found = []
        for manifest in self.root.glob(f"*/*/{MANIFEST}"):
            with contextlib.suppress(OSError):
                found.append((manifest.stat().st_mtime, manifest.parent, _folder_bytes(manifest.parent)))
        return found

    def disk_usage(self) -> int:
        return _folder_bytes(self.root) if self.root.exists() else 0

    def enforce_budget(self) -> None:
        """Remove entries, least recently used first, until they fit the budget."""
        entries = sorted(self.entries())
        total = sum(size for _, _, size in entries)
        while entries and total > self.max_bytes:
            _, folder, size = entries.pop(0)
            shutil.rmtree(folder, ignore_errors=True)
            total -= size
            event(log, "kv_entry_removed", fingerprint=folder.name[:12], reason="budget", bytes=size)
