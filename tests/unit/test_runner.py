"""scheduler/runner.py helpers: engine log rotation, exit descriptions, the error tail of the last run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modelrunner.engines.base import LaunchSpec, Mode, ModelForEngine
from modelrunner.scheduler.runner import Runner, RunnerKey, describe_exit, process_stat, rotate_if_large


def test_an_engine_log_over_the_limit_is_rotated_when_a_runner_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_RUNNER_LOG_MAX_BYTES", "100")
    log = tmp_path / "engine-x.log"
    log.write_bytes(b"a" * 50)
    rotate_if_large(log)
    assert log.read_bytes() == b"a" * 50  # under the limit: left alone
    for generation in range(5):
        log.write_bytes(bytes([65 + generation]) * 101)
        rotate_if_large(log)
        assert not log.exists()
    backups = sorted(p.name for p in tmp_path.iterdir())
    assert backups == ["engine-x.log.1", "engine-x.log.2", "engine-x.log.3"]  # three kept, as daemon.log
    assert (tmp_path / "engine-x.log.1").read_bytes() == b"E" * 101
    rotate_if_large(tmp_path / "absent.log")


def test_exits_are_described_by_code_or_signal() -> None:
    assert describe_exit(None) is None
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-signal.SIGKILL) == "signal SIGKILL"
    assert describe_exit(-200) == "signal 200"


def test_process_stat_reads_state_group_and_cpu() -> None:
    state, group, cpu = process_stat(os.getpid()) or ("", 0, -1.0)
    assert state in "RS" and group == os.getpgrp() and cpu >= 0
    assert process_stat(2**22 + 12345) is None


def test_the_error_tail_quotes_only_the_last_run(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(
        "--- 2026-01-01T00:00:00Z starting llama.cpp for ai/x (completion)\nold failure\n"
        "--- 2026-01-01T00:01:00Z starting llama.cpp for ai/x (completion)\n"
        "error: cannot open /srv/models/bundles/model.gguf\n--- not a header\n"
    )
    model = ModelForEngine("sha256:" + "0" * 64, "ai/x", tmp_path, "gguf", None, 1)
    runner = Runner(
        RunnerKey("llama.cpp", model.id, Mode.COMPLETION),
        model,
        LaunchSpec(argv=["x"], socket=tmp_path / "s.sock"),
        1,
        log,
        tmp_path / "pids",
        60,
    )
    assert runner.error_tail() == "error: cannot open model.gguf\n--- not a header"


# A daemon, as far as engines are concerned: starts one runner of the fake engine, says its pid, waits.
DAEMON = """
import asyncio, sys, time
from pathlib import Path
from modelrunner.engines.base import LaunchSpec, Mode, ModelForEngine
from modelrunner.scheduler.runner import Runner, RunnerKey
folder, script = Path(sys.argv[1]), sys.argv[2]
model = ModelForEngine("sha256:" + "0" * 64, "ai/x", folder, "gguf", None, 1)
socket = folder / "runner-1.sock"
spec = LaunchSpec(argv=[sys.executable, script, str(socket)], socket=socket)
key = RunnerKey("llama.cpp", model.id, Mode.COMPLETION)
runner = Runner(key, model, spec, 1, folder / "e.log", folder / "pids", 60)
asyncio.run(runner.start())
print(runner.pid, flush=True)
time.sleep(600)
"""


def test_engines_end_when_their_daemon_is_killed(tmp_path: Path) -> None:
    from tests.fake_engine import SCRIPT

    daemon = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(tmp_path), str(SCRIPT)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert daemon.stdout is not None
        engine = int(daemon.stdout.readline())
        assert alive(engine)
    finally:
        daemon.kill()  # kill -9: the daemon stops nothing itself
        daemon.wait()
    deadline = time.monotonic() + 30
    try:
        while alive(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(engine), "the engine outlived its daemon"
    finally:
        if alive(engine):
            os.kill(engine, signal.SIGKILL)


def alive(pid: int) -> bool:
    stat = process_stat(pid)
    return stat is not None and stat[0] != "Z"
