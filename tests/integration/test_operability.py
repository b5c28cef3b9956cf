"""Operability with real `model serve` processes and the real llama-server: one daemon per runner home, the
engines a killed daemon left behind, a frozen engine, and `model logs` explaining what the scheduler did."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.scheduler import rundir
from modelrunner.scheduler.runner import process_stat
from tests.daemon import Daemon, Daemons, free_port, parse_logfmt
from tests.models import write_tiny_gguf
from tests.waiting import wait_until


@pytest.fixture
def first(daemons: Daemons, tmp_path: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    """The first daemon of the runner home tmp_path/home, with the tiny model (a long context)."""
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    running = daemons.start()
    running.cli(
        "package", "--gguf", str(write_tiny_gguf(tmp_path / "tiny.gguf", context_length=LONG_CONTEXT)), "tiny"
    )
    return running


def alive(pid: int) -> bool:
    stat = process_stat(pid)
    return stat is not None and stat[0] != "Z"


def engine_pid(daemon: Daemon) -> int:
    [runner] = daemon.http("GET", "/engines/ps").json()
    return int(runner["pid"])


def chat(daemon: Daemon, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    return daemon.http("POST", "/engines/v1/chat/completions", json=body)


# The engine's context is the model's (DMR's rule since its PR #866): room for the longest long_stream.
LONG_CONTEXT = 32768


def long_stream(daemon: Daemon, model: str = "tiny", max_tokens: int = 1500) -> Any:
    """A streamed answer long enough to stay in flight while the test does something else (the engine
    blocks once the unread answer fills the socket buffers, if it gets that far: loopback's buffers hold
    megabytes)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    return httpx.stream("POST", daemon.url + "/engines/v1/chat/completions", json=body, timeout=120)


def data_lines(lines: Iterator[str]) -> list[str]:
    return [line[6:] for line in lines if line.startswith("data: ")]


def log_events(daemon: Daemon, *args: str) -> list[dict[str, str]]:
    """`model logs ARGS`, its logfmt event lines parsed (key=value; quoted values unquoted)."""
    out = daemon.cli("logs", *args).stdout
    return [parse_logfmt(line) for line in out.splitlines() if " event=" in line]


def test_a_second_serve_on_the_same_home_exits_and_touches_nothing(first: Daemon) -> None:
    daemon = first
    assert daemon.process is not None
    with long_stream(daemon) as response:
        lines = response.iter_lines()
        assert data_lines(iter([next(line for line in lines if line.startswith("data: "))]))
        pid = engine_pid(daemon)
        second = subprocess.run(
            [sys.executable, "-m", "modelrunner", "serve", "--port", str(free_port())],
            env=daemon.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert f"pid {daemon.process.pid}" in second.stderr and "already running" in second.stderr
        rest = data_lines(lines)
    assert rest[-1] == "[DONE]"  # the stream in flight meanwhile ended normally
    assert not any('"type": "error"' in event or '"error"' in event for event in rest)
    assert alive(pid)
    assert (daemon.home / "daemon.pid").read_text() == str(daemon.process.pid)
    assert "has stopped" in daemon.cli("stop-runner").stdout
    daemon.process.wait(30)
    assert not alive(pid)


def test_engines_left_by_a_killed_daemon_are_ended_at_the_next_start_with_a_log_line(
    first: Daemon, daemons: Daemons
) -> None:
    assert first.process is not None
    assert chat(first, "tiny").status_code == 200
    pid = engine_pid(first)
    # A kill -9 of the daemon sends its engines SIGTERM (PR_SET_PDEATHSIG: tests/unit/test_runner.py); one
    # that cannot act on it, stopped as a frozen engine is, lives on until the next daemon ends it.
    os.kill(pid, signal.SIGSTOP)
    first.process.kill()
    first.process.wait()
    assert alive(pid)
    second = daemons.start(first.home)
    assert not alive(pid)  # ended before the second daemon listened
    [ended] = [e for e in log_events(second, "--no-engines") if e["event"] == "orphan_ended"]
    assert ended["pid"] == str(pid) and ended["model"] == "tiny" and ended["engine"] == "llama.cpp"
    assert chat(second, "tiny").status_code == 200


def test_a_frozen_llama_server_fails_the_stream_and_is_restarted(
    daemons: Daemons, tmp_path: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    monkeypatch.setenv("MODEL_RUNNER_FREEZE_TIMEOUT", "2")
    daemon = daemons.start()
    daemon.cli(
        "package",
        "--gguf",
        str(write_tiny_gguf(tmp_path / "tiny.gguf", context_length=LONG_CONTEXT)),
        "tiny",
    )
    with long_stream(daemon) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        pid = engine_pid(daemon)
        os.kill(pid, signal.SIGSTOP)  # as a deadlock would: no answer, no exit
        rest = data_lines(lines)
    error = json.loads(rest[-1])["error"]
    assert error["type"] == "server_error" and "engine stopped" in error["message"]
    deadline = time.monotonic() + 30  # the stream's error goes out as the watchdog ends the engine
    while alive(pid):
        assert time.monotonic() < deadline, "the frozen engine was never ended"
        time.sleep(0.05)
    [freeze] = [e for e in log_events(daemon, "--no-engines") if e["event"] == "freeze"]
    assert freeze["pid"] == str(pid) and freeze["model"] == "tiny" and freeze["process_state"] == "T"
    assert chat(daemon, "tiny").status_code == 200  # started again
    assert engine_pid(daemon) != pid


def test_model_logs_explains_loads_evictions_crashes_503s_and_waits(
    daemons: Daemons, tmp_path: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    monkeypatch.setenv("MODEL_RUNNER_MAX_RUNNERS", "1")
    monkeypatch.setenv("MODEL_RUNNER_MAX_QUEUE", "1")
    daemon = daemons.start()
    follower: subprocess.Popen[str] | None = None
    try:
        for seed, name in enumerate(("one", "two")):
            daemon.cli(
                "package",
                "--gguf",
                str(write_tiny_gguf(tmp_path / f"{name}.gguf", seed=seed, context_length=LONG_CONTEXT)),
                name,
            )
        assert chat(daemon, "one").status_code == 200  # a load
        # "one" in use, generating for far longer than the test takes: "two" must wait for room
        with long_stream(daemon, "one", max_tokens=30000) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            results: queue.Queue[httpx.Response] = queue.Queue()
            waiting = threading.Thread(target=lambda: results.put(chat(daemon, "two")))
            waiting.start()
            wait_until(
                lambda: any(e["event"] == "queued" for e in log_events(daemon, "--no-engines")),
                "the queued event",
                timeout=60,
            )
            assert chat(daemon, "two").status_code == 503  # the queue (1) is full
            pass  # the client leaves: its generation stops and "one" is released
        waiting.join(120)
        assert results.get_nowait().status_code == 200  # served after "one" was evicted
        os.kill(engine_pid(daemon), signal.SIGKILL)  # a crash
        follower = subprocess.Popen(
            [sys.executable, "-m", "modelrunner", "logs", "--follow", "--no-engines"],
            env=daemon.env,
            stdout=subprocess.PIPE,
            text=True,
        )

        def with_the_crash() -> list[dict[str, str]]:  # written once the daemon has seen the exit
            found = log_events(daemon, "--no-engines")
            return found if any(e["event"] == "crash" for e in found) else []

        events = wait_until(with_the_crash, "the crash's log line")
        by_name: dict[str, list[dict[str, str]]] = {}
        for found in events:
            by_name.setdefault(found["event"], []).append(found)

        [load_one, load_two] = by_name["load"]
        assert load_one["model"] == "one" and load_one["command"].startswith(str(llama_server))
        assert load_two["model"] == "two" and load_two["engine"] == "llama.cpp"
        assert [e["model"] for e in by_name["ready"]] == ["one", "two"]
        assert float(by_name["ready"][0]["load_seconds"]) > 0
        [queued] = by_name["queued"]
        assert queued["model"] == "two" and queued["position"] == "1" and queued["reason"] == "max_runners"
        [refused] = by_name["refused"]
        assert refused["status"] == "503" and refused["reason"] == "queue_full" and refused["model"] == "two"
        [evict] = by_name["evict"]
        assert evict["model"] == "one" and evict["reason"] == "lru_max_runners"
        assert evict["for_model"] == "two"
        [crash] = by_name["crash"]
        assert crash["model"] == "two" and crash["status"] == "signal SIGKILL"
        assert any(e["model"] == "one" for e in by_name["reuse"])

        # --model: only the lines about that model (whatever name they use), and its engine's log
        about_one = log_events(daemon, "--no-engines", "--model", "ai/one:latest")
        assert about_one and all(e["model"] == "one" or e.get("for_model") == "one" for e in about_one)
        assert {"load", "ready", "evict"} <= {e["event"] for e in about_one}
        engine_log = daemon.cli("logs", "--model", "two").stdout
        assert "starting llama.cpp for two (completion)" in engine_log
        assert "starting llama.cpp for one" not in engine_log

        # --follow: what happens next arrives while following
        assert chat(daemon, "one").status_code == 200
        pid = str(engine_pid(daemon))
        assert pid not in {e["pid"] for e in by_name["ready"]}
        assert follower.stdout is not None
        followed: queue.Queue[str] = queue.Queue()
        lines_of = follower.stdout

        def forward() -> None:
            for line in lines_of:
                followed.put(line)

        threading.Thread(target=forward, daemon=True).start()
        while True:
            seen = parse_logfmt(followed.get(timeout=60))
            if seen.get("event") == "ready" and seen.get("pid") == pid:
                break
    finally:
        if follower is not None:
            follower.kill()
            follower.wait()


def test_a_daemon_stopped_by_sigterm_cleans_up_and_has_its_last_lines_in_its_log(first: Daemon) -> None:
    """uvicorn stops gracefully on SIGTERM, then raises the signal again: the daemon removes its pid file
    first (server/daemon.py pass_on_sigterm), and still ends by the signal. The log has every line, up to
    uvicorn's last (eventlog.LineHandler: only a request's `reuse` line waits for the end of a turn, and the
    request's access line writes it)."""
    daemon = first
    assert daemon.process is not None
    for _ in range(2):
        assert chat(daemon, "tiny").status_code == 200
    assert (daemon.home / "daemon.pid").read_text() == str(daemon.process.pid)
    daemon.process.terminate()
    assert daemon.process.wait(30) == -signal.SIGTERM
    assert not (daemon.home / "daemon.pid").exists()  # no pid left for `model stop-runner` to signal later
    assert not rundir.runtime_dir(daemon.home).exists()  # its engines' sockets and records went with them
    lines = (daemon.home / "logs" / "daemon.log").read_text().splitlines()
    assert "Application shutdown complete" in lines[-2] and "Finished server process" in lines[-1]
    events = [parse_logfmt(line) for line in lines if " event=" in line]
    reuse = [i for i, e in enumerate(events) if e["event"] == "reuse" and e.get("model") == "tiny"]
    chats = [
        i for i, e in enumerate(events) if e["event"] == "request" and e["path"].endswith("/completions")
    ]
    assert reuse and len(chats) == 2 and reuse[-1] < chats[-1]  # the reuse line, before its access line
