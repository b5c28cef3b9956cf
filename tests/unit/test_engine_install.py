"""engines/install.py: the one "cached, else made under the entry's lock" of every engine installer."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from modelrunner.engines import build, diffusers, vllm
from modelrunner.engines.install import cache_lock, cached_or_made, engine_cache_root


def test_a_cached_entry_is_used_as_it_is(tmp_path: Path) -> None:
    said: list[str] = []

    def make() -> Path:
        raise AssertionError("a cached entry is not made again")

    found = cached_or_made(tmp_path, "k", "waiting", said.append, lambda: tmp_path / "k", make)
    assert found == tmp_path / "k" and said == []


def test_a_missing_entry_is_made_once_under_its_lock(tmp_path: Path) -> None:
    made: list[Path] = []

    def make() -> Path:
        assert (tmp_path / ".k.lock").exists()  # the lock is held while making
        made.append(tmp_path / "k")
        return made[-1]

    assert cached_or_made(tmp_path, "k", "waiting", print, lambda: None, make) == tmp_path / "k"
    assert made == [tmp_path / "k"]


def test_an_entry_made_by_whoever_held_the_lock_first_is_not_made_again(tmp_path: Path) -> None:
    said: list[str] = []
    entry = tmp_path / "k"
    holding, release = threading.Event(), threading.Event()

    def other_install() -> None:
        with cache_lock(tmp_path, "k", "other waits", print):
            holding.set()
            release.wait()
            entry.mkdir()

    def progress(line: str) -> None:
        said.append(line)
        release.set()  # we wait for the lock: the other install may now end

    def make() -> Path:
        raise AssertionError("the other install made it")

    other = threading.Thread(target=other_install)
    other.start()
    holding.wait()
    try:
        found = cached_or_made(
            tmp_path, "k", "waiting for the other", progress, lambda: entry if entry.is_dir() else None, make
        )
    finally:
        release.set()
        other.join()
    assert found == entry and said == ["waiting for the other"]


def test_every_engine_caches_under_one_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert engine_cache_root("tools") == tmp_path / "modelrunner" / "tools"
    assert build.cache_root() == tmp_path / "modelrunner" / "llama.cpp"
    assert vllm.cache_root() == tmp_path / "modelrunner" / "vllm"
    assert diffusers.cache_root() == tmp_path / "modelrunner" / "diffusers"
