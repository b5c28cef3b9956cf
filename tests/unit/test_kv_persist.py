"""Saved prompt caches in the store (scheduler/kv_persist.py): fingerprints, whole entries, the budget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from modelrunner.engines.base import SavedSlot
from modelrunner.scheduler.kv_persist import MANIFEST, KvStore, fingerprint
from modelrunner.store.layout import StoreLayout

MODEL = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def saved(kv: KvStore, model: str, fp: str, sizes: list[int]) -> list[SavedSlot]:
    """What an engine leaves in a runner's save folder: one file per slot."""
    work = kv.work_area(fp[:8])
    slots = []
    for slot, size in enumerate(sizes):
        (work / f"slot-{slot}.bin").write_bytes(b"k" * size)
        slots.append(SavedSlot(slot, f"slot-{slot}.bin", tokens=size // 10, bytes=size, prompt=(1, 2)))
    return slots


def commit(kv: KvStore, model: str, fp: str, sizes: list[int]) -> None:
    kv.commit(model, fp, kv.root / ".work" / fp[:8], saved(kv, model, fp, sizes))


@pytest.fixture
def kv(tmp_path: Path) -> KvStore:
    return KvStore(StoreLayout(tmp_path / "models"), max_bytes=2000)


def test_the_fingerprint_changes_with_the_model_and_with_the_engine_run() -> None:
    run = '["b11434", ["--ctx-size", "512"]]'
    assert fingerprint(MODEL, run) == fingerprint(MODEL, run)
    assert fingerprint(MODEL, run) != fingerprint(OTHER, run)
    assert fingerprint(MODEL, run) != fingerprint(MODEL, '["b11434", ["--ctx-size", "1024"]]')
    with pytest.raises(Exception, match="digest"):
        fingerprint("../etc", run)


def test_a_committed_entry_is_found_whole_and_its_save_folder_emptied(kv: KvStore) -> None:
    commit(kv, MODEL, "f1", [100, 200])
    entry = kv.entry(MODEL, "f1")
    assert entry is not None and entry.size == 300 and [s.slot for s in entry.slots] == [0, 1]
    assert entry.folder == kv.layout.kv_cache_path(MODEL) / "f1"
    assert not list((kv.root / ".work" / "f1").iterdir())  # moved, not copied
    assert kv.entry(MODEL, "f2") is None and kv.entry(OTHER, "f1") is None


def test_an_entry_without_its_manifest_or_with_a_short_file_is_no_entry(kv: KvStore) -> None:
    commit(kv, MODEL, "f1", [100])
    (kv.layout.kv_cache_path(MODEL) / "f1" / MANIFEST).unlink()  # as a save cut short before the manifest
    assert kv.entry(MODEL, "f1") is None
    assert not (kv.layout.kv_cache_path(MODEL) / "f1").exists()
    commit(kv, MODEL, "f2", [100])
    (kv.layout.kv_cache_path(MODEL) / "f2" / "slot-0.bin").write_bytes(b"short")
    assert kv.entry(MODEL, "f2") is None


def test_least_recently_used_entries_go_first_to_keep_to_the_budget(kv: KvStore) -> None:
    commit(kv, MODEL, "old", [600])
    commit(kv, MODEL, "used", [600])
    entry = kv.entry(MODEL, "old")
    assert entry is not None
    os.utime(kv.layout.kv_cache_path(MODEL) / "used" / MANIFEST, (1, 1))  # "used" is the older now
    kv.touch(entry)
    commit(kv, OTHER, "new", [600])  # with their manifests, over 2000: one must go
    assert kv.entry(MODEL, "used") is None
    assert kv.entry(MODEL, "old") is not None and kv.entry(OTHER, "new") is not None


def test_an_entry_larger_than_the_budget_is_not_kept(kv: KvStore) -> None:
    commit(kv, MODEL, "big", [2500])
    assert kv.entry(MODEL, "big") is None
    assert kv.entries() == []


def test_removing_a_model_removes_its_entries_only(kv: KvStore) -> None:
    commit(kv, MODEL, "f1", [100])
    commit(kv, OTHER, "f1", [100])
    kv.remove_model(MODEL)
    assert kv.entry(MODEL, "f1") is None and kv.entry(OTHER, "f1") is not None
    assert 100 < kv.disk_usage() < 1000  # the other entry: its slot and manifest


def test_sweep_removes_what_a_killed_daemon_left(kv: KvStore) -> None:
    saved(kv, MODEL, "left", [10])
    partial = kv.layout.kv_cache_path(MODEL) / ".f1.1234.tmp"
    partial.mkdir(parents=True)
    kv.sweep()
    assert not (kv.root / ".work").exists() and not partial.exists()


def test_the_budget_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_RUNNER_KV_CACHE_MAX", "2MiB")
    assert KvStore(StoreLayout(tmp_path / "models")).max_bytes == 2 * 2**20
    monkeypatch.setenv("MODEL_RUNNER_KV_CACHE_MAX", "lots")
    with pytest.raises(ValueError, match="MODEL_RUNNER_KV_CACHE_MAX"):
        KvStore(StoreLayout(tmp_path / "models"))
    monkeypatch.delenv("MODEL_RUNNER_KV_CACHE_MAX")
    assert KvStore(StoreLayout(tmp_path / "models")).max_bytes > 0  # a share of the free disk
