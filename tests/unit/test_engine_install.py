"""engines/install.py: the one "cached, else made under the entry's lock" of every engine installer, the one
way an install step runs, a runner home's install and its status, and a cached environment linked from it."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from modelrunner.engines import build, diffusers, mlx, vllm
from modelrunner.engines.base import InstallState
from modelrunner.engines.install import (
    ENV_INFO,
    NOT_INSTALLED,
    CachedEnv,
    HomeInstall,
    LinkedInstall,
    cache_lock,
    cached_or_made,
    engine_cache_root,
    pip_progress,
    run_step,
)
from modelrunner.errors import EngineInstallError


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
    assert mlx.environment().folder.parent == tmp_path / "modelrunner" / "mlx"


# -- one install step -----------------------------------------------------------------------------------

SCRIPT = (
    "import sys; folder = sys.argv[1]\n"
    "print('Collecting tiny-package from ' + folder)\n"
    "print('WARNING: Location ' + folder + ' is ignored: it is neither a file nor a directory')\n"
    "for n in range(40): print('line', n)\n"
    "sys.exit(int(sys.argv[2]))\n"
)


def test_a_step_returns_its_output_with_the_folder_hidden_and_pips_noise_dropped(tmp_path: Path) -> None:
    said: list[str] = []
    out = run_step(
        [sys.executable, "-c", SCRIPT, str(tmp_path), "0"],
        "a step",
        tmp_path,
        "<env>",
        pip_progress(said.append),
    )
    lines = out.splitlines()
    assert lines[0] == "Collecting tiny-package from <env>" and lines[-1] == "line 39" and len(lines) == 41
    assert said == ["pip: Collecting tiny-package from <env>"]  # pip's main lines only, as progress


def test_a_failed_step_says_its_last_lines_and_never_the_folder(tmp_path: Path) -> None:
    with pytest.raises(EngineInstallError) as failed:
        run_step([sys.executable, "-c", SCRIPT, str(tmp_path), "3"], "installing tiny", tmp_path, "<cache>")
    message = failed.value.message
    assert message.startswith("installing tiny failed (exit 3):") and message.endswith("line 39")
    assert "line 14" not in message and str(tmp_path) not in message
    with pytest.raises(EngineInstallError, match="checking could not start"):
        run_step([str(tmp_path / "absent")], "checking", tmp_path)


# -- a runner home's install ----------------------------------------------------------------------------


def test_a_home_install_says_installing_then_why_it_failed(tmp_path: Path) -> None:
    home = HomeInstall("tiny", tmp_path / "engines" / "tiny")
    assert home.status(NOT_INSTALLED, None, "nothing here").describe("tiny") == "Not Installed: nothing here"
    assert home.status(NOT_INSTALLED, None, "-", lambda: "not on this CPU").detail == "not on this CPU"
    seen: list[str] = []
    with pytest.raises(EngineInstallError), home.installing("installing tiny 1"):
        seen.append(home.status(NOT_INSTALLED, None, "-").describe("tiny"))
        raise EngineInstallError("pip failed\nits output")
    assert seen == ["Installing: installing tiny 1"]
    failed = home.status(NOT_INSTALLED, None, "-")
    assert failed.state is InstallState.ERROR and failed.detail == "install failed: pip failed"
    assert home.status(None, "1.0", "-").describe("tiny") == "Running: tiny 1.0"
    assert home.status("it is broken", None, "-").state is InstallState.ERROR


def test_a_linked_install_links_the_cached_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = CachedEnv("tiny", "1-abc", "the tiny environment")
    said: list[str] = []

    def create(folder: Path) -> dict[str, Any]:
        (folder / "bin").mkdir()
        (folder / "bin" / "python").write_text("")
        return {"made": True}

    made = env.ensure(said.append, create)
    assert made == env.found() == tmp_path / "cache" / "modelrunner" / "tiny" / "1-abc"
    assert json.loads((made / ENV_INFO).read_text()) == {"made": True}
    assert said[0].startswith("Created the tiny environment in ")

    home = LinkedInstall("tiny", "1", tmp_path / "home" / "engines" / "tiny")
    assert home.problem(lambda _: True) == NOT_INSTALLED
    home.place(made, {"version": "1"}, lambda folder: (folder / "server.py").write_text("x"))
    assert home.python.parent.parent.resolve() == made and (home.folder / "server.py").is_file()
    assert home.problem(lambda info: info == {"version": "1"}) is None
    assert "another modelrunner version" in (home.problem(lambda _: False) or "")
    assert home.disk_usage() < 100  # the environment is linked, not counted
    home.remove()
    assert not home.root.exists() and env.found() == made  # other homes still use it
