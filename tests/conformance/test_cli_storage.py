"""Where the files are (issue 37 item 7): `df -v` lists the model store, the runner home and the engine cache
(builds and environments shared by every runner home) with their sizes, after DMR's `df` table unchanged;
`uninstall-runner` says on stderr that it leaves the engine cache and how to remove it (stdout stays
DMR's, docker/model-runner `cmd/cli/commands/df.go`, `uninstall-runner.go`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from modelrunner.cli.dmrformat import custom_size
from tests.conformance.dmr_daemons import cli_env, run_cli
from tests.inprocess import InProcessDaemon


def local_env(tmp_path: Path, daemon: InProcessDaemon) -> dict[str, str]:
    """The CLI with the daemon's runner home and an engine cache holding a 3000-byte build."""
    build = tmp_path / "cache" / "modelrunner" / "llama.cpp" / "b1"
    build.mkdir(parents=True)
    (build / "llama-server").write_bytes(b"x" * 3000)
    return cli_env(
        tmp_path, daemon.url, MODEL_RUNNER_HOME=str(daemon.home), XDG_CACHE_HOME=str(tmp_path / "cache")
    )


def test_df_verbose_lists_where_the_files_are(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = local_env(tmp_path, fake_daemon)
    plain = run_cli(env, "df")
    verbose = run_cli(env, "df", "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert verbose.stdout.startswith(plain.stdout + "\n")  # DMR's table first, as it was
    rows = {}
    for line in verbose.stdout[len(plain.stdout) :].splitlines():
        words = line.split()
        if len(words) > 2:
            rows[" ".join(words[:-2])] = words[-2:]
    cache = tmp_path / "cache" / "modelrunner"
    assert rows["WHERE"] == ["SIZE", "PATH"]
    assert rows["Engine cache"] == [custom_size(3000), str(cache)]
    assert rows["llama.cpp"] == [custom_size(3000), str(cache / "llama.cpp")]
    assert rows["Model store"][1] == str(fake_daemon.home / "models")
    assert rows["Runner home"][1] == str(fake_daemon.home)
    assert re.fullmatch(r"\d+\.\d\d[kMG]B", rows["Model store"][0])  # it holds the packaged tiny model
    assert "uninstall-runner leaves it" in verbose.stdout


def test_only_a_runner_on_this_machine_has_its_places_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner named on another host keeps its files there: no path of this machine is shown for it."""
    from modelrunner.cli.storage import runner_is_here

    monkeypatch.setenv("MODEL_RUNNER_HOST", "http://10.1.2.3:12434")
    assert not runner_is_here()
    monkeypatch.setenv("MODEL_RUNNER_HOST", "http://127.0.0.1:12999")
    assert runner_is_here()


def test_uninstall_runner_says_what_it_leaves(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    env = local_env(tmp_path, fake_daemon)
    result = run_cli(env, "uninstall-runner")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1  # the daemon's message, as before
    cache = tmp_path / "cache" / "modelrunner"
    assert result.stderr == (
        f"Kept: the engine cache, {custom_size(3000)} at {cache} (builds and environments shared by every "
        "runner home: a reinstall takes seconds).\n"
        f"To remove it too: rm -rf {cache}\n"
    )
