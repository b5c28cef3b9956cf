"""One engine process serving one model in one mode, on a Unix socket: start, readiness, stop, crash."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from modelrunner import http1
from modelrunner.engines.base import LaunchSpec, Mode, ModelForEngine
from modelrunner.errors import ModelRunnerError

READINESS_POLL = 0.01  # seconds: a ready engine is noticed within ~10 ms, not DMR's 500 ms
LOAD_TIMEOUT = 600.0
STOP_GRACE = 10.0
_ABS_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)")


class LoadError(ModelRunnerError):
    status_code = 500


def scrub_paths(text: str) -> str:
    """Engine messages may name files by absolute path; users see only the file name."""
    return _ABS_PATH.sub(r"\1", text)


@dataclass(frozen=True)
class RunnerKey:
    engine: str
    model_id: str
    mode: Mode


class RunnerState(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    DEFUNCT = "defunct"
    STOPPING = "stopping"


async def http_status(socket: Path, path: str) -> int | None:
    result = await http1.get(str(socket), path, timeout=1.0)
    return result[0] if result else None


async def http_get(socket: Path, path: str) -> str | None:
    """Body of a successful GET on a runner's socket (e.g. its /metrics), else None."""
    result = await http1.get(str(socket), path)
    return result[1].decode("utf-8", "replace") if result and result[0] == 200 else None


class Runner:
    def __init__(
        self,
        key: RunnerKey,
        model: ModelForEngine,
        spec: LaunchSpec,
        memory: int,
        log_path: Path,
        pid_dir: Path,
        keep_alive: float,
    ) -> None:
        self.key = key
        self.model = model
        self.spec = spec
        self.memory = memory
        self.log_path = log_path
        self.pid_dir = pid_dir
        self.keep_alive = keep_alive
        self.state = RunnerState.LOADING
        self.in_use = 0
        self.last_used = time.time()
        self.process: asyncio.subprocess.Process | None = None
        self.load_task: asyncio.Task[None] | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.load_seconds = 0.0
        self.exited = asyncio.Event()

    @property
    def socket(self) -> Path:
        return self.spec.socket

    @property
    def pid_file(self) -> Path | None:
        return self.pid_dir / f"{self.process.pid}.json" if self.process else None

    async def start(self) -> None:
        """Spawn the engine and wait until its health route answers 200; LoadError if it exits first."""
        started = time.monotonic()
        if self.spec.preflight is not None:  # remote parts first: a clear error beats a dying engine
            await asyncio.to_thread(self.spec.preflight)
        self.socket.unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(
                f"--- starting {self.key.engine} for {self.model.reference} ({self.key.mode})\n".encode()
            )
            log.flush()
            self.process = await asyncio.create_subprocess_exec(
                *self.spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, **self.spec.env},
                start_new_session=True,  # our signals, not the terminal's, stop engines
            )
        self._record_pid()
        asyncio.get_running_loop().create_task(self._watch_exit())
        deadline = started + LOAD_TIMEOUT
        while time.monotonic() < deadline:
            if self.exited.is_set():
                raise LoadError(f"unable to load runner: {self.error_tail()}")
            if await http_status(self.socket, self.spec.health_path) == 200:
                self.state = RunnerState.READY
                self.load_seconds = time.monotonic() - started
                return
            await asyncio.sleep(READINESS_POLL)
        await self.stop()
        raise LoadError(f"unable to load runner: the engine was not ready after {LOAD_TIMEOUT:.0f} s")

    async def _watch_exit(self) -> None:
        assert self.process is not None
        await self.process.wait()
        if self.state is not RunnerState.STOPPING:
            self.state = RunnerState.DEFUNCT
        self.exited.set()
        if self.pid_file:
            self.pid_file.unlink(missing_ok=True)
        self.socket.unlink(missing_ok=True)

    def _record_pid(self) -> None:
        """So a daemon restarted after a crash can find and end engines it orphaned."""
        assert self.process is not None and self.pid_file is not None
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        self.pid_file.write_text(json.dumps({"pid": self.process.pid, "socket": str(self.socket)}))

    def error_tail(self) -> str:
        """The end of the engine's output: what it said before dying (DMR shows the last 1 KiB)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - 1024))
                tail = log.read().decode("utf-8", "replace")
        except OSError:
            tail = ""
        tail = tail.rsplit("--- starting", 1)[-1].split("\n", 1)[-1] if "--- starting" in tail else tail
        code = self.process.returncode if self.process else None
        text = scrub_paths(tail.strip()) or "no output"
        return f"engine exited with code {code}: {text}" if code is not None else text

    async def stop(self, grace: float = STOP_GRACE) -> None:
        self.state = RunnerState.STOPPING
        if self.idle_timer:
            self.idle_timer.cancel()
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.exited.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await self.exited.wait()


def end_orphans(pid_dir: Path) -> int:
    """End engine processes left by a daemon that died without stopping them; returns how many."""
    ended = 0
    if not pid_dir.is_dir():
        return 0
    for record in pid_dir.glob("*.json"):
        try:
            info = json.loads(record.read_text())
            pid, socket = int(info["pid"]), str(info["socket"])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
        except (OSError, ValueError, KeyError, TypeError):
            record.unlink(missing_ok=True)
            continue
        if socket in cmdline:  # the same process, not a recycled pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                ended += 1
        record.unlink(missing_ok=True)
    return ended
