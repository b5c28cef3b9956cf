"""`unload`/`stop` find a model by the name `ps` shows (issues 34 and 37): after `model rm` of a loaded model
its runner is found by any spelling of the name it was loaded under and by its ID; a model that answers a
request is said to be in use, not "No such model(s) running." (DMR's words when nothing is loaded).

Follows: docker/model-runner `cmd/cli/commands/unload.go` (its messages), `ps.go` (the names it shows).
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.conformance.dmr_daemons import FakeDaemons, cli_env, package, run_cli
from tests.waiting import wait_until


def test_stop_finds_a_removed_models_runner_by_another_spelling(
    fake_daemons: FakeDaemons, tmp_path: Path
) -> None:
    """Before: loaded as `ai/tiny:latest`, then removed, `stop tiny` (what ps shows) found no runner: the
    runner's name was matched only as it was typed at load."""
    daemon = fake_daemons.start({"FAKE_CHUNKS": "3"})
    env = cli_env(tmp_path, daemon.url)
    for seed, spelling in enumerate(("tiny", "docker.io/ai/tiny")):
        if seed:
            package(daemon, tmp_path, "tiny", seed)  # back in the store for the next spelling
        assert run_cli(env, "run", "-d", "ai/tiny:latest").returncode == 0
        assert run_cli(env, "rm", "-f", "ai/tiny:latest").returncode == 0
        assert run_cli(env, "ps").stdout.splitlines()[1].startswith("tiny ")
        stopped = run_cli(env, "stop", spelling)
        assert (stopped.returncode, stopped.stdout) == (0, "Unloaded 1 model(s).\n"), spelling
        assert daemon.ps() == []


def test_stop_by_the_id_ps_shows(fake_daemons: FakeDaemons, tmp_path: Path) -> None:
    daemon = fake_daemons.start({"FAKE_CHUNKS": "3"})
    env = cli_env(tmp_path, daemon.url)
    assert run_cli(env, "run", "-d", "tiny").returncode == 0
    [runner] = daemon.ps()
    short = runner["model_id"].removeprefix("sha256:")[:12]
    assert run_cli(env, "rm", "-f", "tiny").returncode == 0
    assert run_cli(env, "unload", short).stdout == "Unloaded 1 model(s).\n"


def test_unload_of_a_model_in_use_says_so(fake_daemons: FakeDaemons, tmp_path: Path) -> None:
    daemon = fake_daemons.start({"FAKE_CHUNKS": "40", "FAKE_CHUNK_DELAY": "0.1"})
    env = cli_env(tmp_path, daemon.url)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}

    def answer() -> None:
        httpx.post(daemon.url + "/engines/v1/chat/completions", json=body, timeout=60).read()

    streaming = threading.Thread(target=answer)
    streaming.start()
    try:
        wait_until(lambda: any(r["in_use"] for r in daemon.ps()), "the model in use")
        result = run_cli(env, "unload", "tiny")
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout == (
            "Not unloaded: tiny is answering requests; a runner in use is left alone, unload it again when "
            "it is idle.\n"
        )
        assert run_cli(env, "unload", "absent").stdout == "No such model(s) running.\n"  # DMR's words stay
    finally:
        streaming.join(30)
    assert run_cli(env, "unload", "tiny").stdout == "Unloaded 1 model(s).\n"
