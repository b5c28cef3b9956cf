"""One engine process serving one model in one mode, on a Unix socket: start, readiness, health, stop, crash.

An engine runs as a process group of its own (vLLM is three processes), and every process of it carries
the runner's tag in its environment, so the group can be found again and told apart from a process that
happens to reuse a pid: by this daemon when it stops the engine, and by the next daemon when this one was
killed (end_orphans). Stopping ends the whole group and waits until none of it is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import json
import logging
import os
import re
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

from modelrunner import http1
from modelrunner.child_process import end_with_parent
from modelrunner.engines import exit_reason
from modelrunner.engines.base import LaunchSpec, Mode, ModelForEngine
from modelrunner.errors import ModelRunnerError
from modelrunner.eventlog import DEFAULT_BACKUPS, event, log_max_bytes
from modelrunner.scheduler import rundir
from modelrunner.scheduler.conversations import Abandoned, Turns, side_wait_from_env
from modelrunner.scheduler.settings import ModelSettings

log = logging.getLogger(__name__)

READINESS_POLL = 0.01  # seconds: a ready engine is noticed within ~10 ms, not DMR's 500 ms
LOAD_TIMEOUT = 600.0
STOP_GRACE = 10.0  # SIGTERM, then this long before SIGKILL
KILL_WAIT = 5.0  # after SIGKILL: how long to wait for the group to be gone before saying so in the log
GROUP_POLL = 0.05
TAG_ENV = "MODEL_RUNNER_ENGINE_TAG"  # in every engine process's environment: which runner it belongs to
_ABS_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)")
_START_LINE = re.compile(r"^--- \S+ starting .*\n", re.MULTILINE)  # what start() writes before each run


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


def connectable(socket: Path) -> bool:
    """Whether the engine socket is there and ours (see rundir.untrusted_socket)."""
    try:
        return rundir.untrusted_socket(socket) is None
    except FileNotFoundError:
        return False


async def http_status(socket: Path, path: str, timeout: float = 1.0) -> int | None:
    if not connectable(socket):
        return None
    result = await http1.get(str(socket), path, timeout=timeout)
    return result[0] if result else None


async def http_get(socket: Path, path: str) -> str | None:
    """Body of a successful GET on a runner's socket (e.g. its /metrics), else None."""
    if not connectable(socket):
        return None
    result = await http1.get(str(socket), path)
    return result[1].decode("utf-8", "replace") if result and result[0] == 200 else None


# -- processes, through /proc ----------------------------------------------------------------------------


def process_stat(pid: int) -> tuple[str, int, float] | None:
    """(state letter, process group, CPU seconds used) of a process, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # the command name, in parentheses, may hold spaces
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        return fields[0], int(fields[2]), ticks / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return None


def _has_tag(pid: int, tag: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return f"{TAG_ENV}={tag}".encode() in handle.read().split(b"\0")
    except OSError:
        return False


def group_members(pgid: int, tag: str) -> list[int]:
    """Live processes of the engine group `pgid` that carry `tag` (zombies are gone already)."""
    members = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            stat = process_stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] != "Z" and _has_tag(int(entry.name), tag):
                members.append(int(entry.name))
    return members


def signal_processes(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def describe_exit(returncode: int | None) -> str | None:
    if returncode is None:
        return None
    if returncode < 0:
        name = exit_reason.signal_name(-returncode)
        return name if name.startswith("signal ") else f"signal {name}"
    return f"exit code {returncode}"


def rotate_if_large(path: Path) -> None:
    """Engine output goes straight to a file the engine holds open, so it is rotated (by size, like
    daemon.log) when a runner starts rather than while it writes."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > log_max_bytes():
            handler = RotatingFileHandler(path, backupCount=DEFAULT_BACKUPS, delay=True)
            handler.doRollover()
            handler.close()


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
        self.tag = uuid.uuid4().hex
        self.state = RunnerState.LOADING
        self.in_use = 0
        self.last_used = time.time()
        self.abandoned = Abandoned()  # conversations whose client left while the engine worked on them
        self.turns = Turns(
            side_wait_from_env()
        )  # interactive requests in flight, which side requests wait for
        self.process: asyncio.subprocess.Process | None = None
        self.load_task: asyncio.Task[None] | None = None
        self.exit_task: asyncio.Task[None] | None = None  # owned here: watches the engine until it is gone
        self.idle_timer: asyncio.TimerHandle | None = None
        self.load_seconds = 0.0
        self.settings: ModelSettings | None = None  # the configuration it was started with
        self.superseded = False  # retired by `configure` with new settings: its waiters load those
        self.exited = asyncio.Event()  # the engine's main process exited
        self.gone = asyncio.Event()  # ... and every other process of its group too: its memory is free

    @property
    def name(self) -> str:
        return self.model.reference

    @property
    def stopping(self) -> bool:
        return self.state is RunnerState.STOPPING

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def socket(self) -> Path:
        return self.spec.socket

    @property
    def pid_file(self) -> Path | None:
        return self.pid_dir / f"{self.process.pid}.json" if self.process else None

    @property
    def exit_status(self) -> str | None:
        """ "exit code 3" or "signal SIGKILL" once the main process exited."""
        return describe_exit(self.process.returncode if self.process else None)

    async def start(self, before_ready: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Spawn the engine and wait until its health route answers 200; LoadError if it exits first.
        `before_ready` runs once it answers, before it takes traffic (a restore of its prompt cache); when
        it returns False the engine is started again, clean."""
        if self.stopping:  # stopped (daemon shutdown) before it could start
            self.gone.set()
            raise LoadError("the model runner is shutting down")
        started = time.monotonic()
        if self.spec.preflight is not None:  # remote parts first: a clear error beats a dying engine
            await asyncio.to_thread(self.spec.preflight)
        self.socket.unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_if_large(self.log_path)
        with open(self.log_path, "ab") as log_file:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            log_file.write(
                f"--- {stamp} starting {self.key.engine} for {self.name} ({self.key.mode})\n".encode()
            )
            log_file.flush()
            self.process = await asyncio.create_subprocess_exec(
                *self.spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env={**os.environ, **self.spec.env, TAG_ENV: self.tag},
                start_new_session=True,  # a process group of its own: our signals reach all of it
                preexec_fn=end_with_parent(os.getpid()),
            )
        self._record_pid()
        # outlives the request that started the engine: its lines carry no request id (a fresh context)
        loop = asyncio.get_running_loop()
        self.exit_task = loop.create_task(self._watch_exit(), context=contextvars.Context())
        if self.stopping:  # stopped while it was being spawned
            await self.stop(grace=0)
            raise LoadError("the model runner is shutting down")
        deadline = started + LOAD_TIMEOUT
        while time.monotonic() < deadline:
            if self.exited.is_set():
                raise LoadError(f"unable to load runner: {self.error_tail()}")
            try:
                untrusted = rundir.untrusted_socket(self.socket)
            except FileNotFoundError:  # not listening yet
                await asyncio.sleep(READINESS_POLL)
                continue
            if untrusted is not None:  # not the engine's: never connected to, never made ready
                event(log, "engine_socket_refused", logging.ERROR, model=self.name, reason=untrusted)
                await self.stop(grace=0)
                raise LoadError(f"unable to load runner: {untrusted}")
            if await http_status(self.socket, self.spec.health_path) == 200:
                if before_ready is not None and not await before_ready():
                    await self._start_again()
                    return
                self.state = RunnerState.READY
                self.load_seconds = time.monotonic() - started
                return
            await asyncio.sleep(READINESS_POLL)
        await self.stop()
        raise LoadError(f"unable to load runner: the engine was not ready after {LOAD_TIMEOUT:.0f} s")

    async def _start_again(self) -> None:
        """End the engine and start a fresh one in its place (same socket, same log, a new tag)."""
        await self.stop(grace=0)
        self.state = RunnerState.LOADING
        self.process, self.exit_task = None, None
        self.exited, self.gone = asyncio.Event(), asyncio.Event()
        self.tag = uuid.uuid4().hex
        await self.start()

    async def answers_health(self, timeout: float) -> bool:
        """Whether the engine answers its health route at all (any status: a busy engine may say 503)."""
        return await http_status(self.socket, self.spec.health_path, timeout) is not None

    async def _watch_exit(self) -> None:
        """When the main process exits: the rest of its group goes too, then the runner is gone."""
        assert self.process is not None
        await self.process.wait()
        if self.state is not RunnerState.STOPPING:
            self.state = RunnerState.DEFUNCT
        self.exited.set()
        try:
            await self._end_group(self.process.pid)
        finally:
            if self.pid_file:
                self.pid_file.unlink(missing_ok=True)
            self.socket.unlink(missing_ok=True)
            self.gone.set()

    async def _end_group(self, pgid: int) -> None:
        """Processes of the group left after its leader exited: SIGTERM, then SIGKILL; wait until none is
        left (a vLLM worker outliving its API server would hold its memory)."""
        for signum, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, KILL_WAIT)):
            members = group_members(pgid, self.tag)
            if not members:
                return
            signal_processes(members, signum)
            signal_processes(members, signal.SIGCONT)  # a stopped process acts on SIGTERM only once resumed
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and group_members(pgid, self.tag):
                await asyncio.sleep(GROUP_POLL)
        left = group_members(pgid, self.tag)
        if left:
            event(log, "engine_processes_left", logging.ERROR, model=self.name, pids=",".join(map(str, left)))

    def _record_pid(self) -> None:
        """So a daemon restarted after a crash can find and end engines it orphaned."""
        assert self.process is not None and self.pid_file is not None
        rundir.ensure_private_dir(self.pid_dir)
        record = {
            "pid": self.process.pid,
            "socket": str(self.socket),
            "tag": self.tag,
            "engine": self.key.engine,
            "model": self.name,
            "mode": self.key.mode.value,
        }
        rundir.write_private_file(self.pid_file, json.dumps(record).encode())

    def error_tail(self) -> str:
        """How the engine ended, in words, with what it said before (DMR shows the last 1 KiB of output)."""
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(0, os.SEEK_END)
                size = log_file.tell()
                log_file.seek(max(0, size - 4096))
                tail = log_file.read().decode("utf-8", "replace")
        except OSError:
            tail = ""
        starts = list(_START_LINE.finditer(tail))
        if starts:
            tail = tail[starts[-1].end() :]
        code = self.process.returncode if self.process else None
        text = scrub_paths(tail.strip())
        if code is None:
            return text[-1024:] or "no output"
        return exit_reason.describe_exit(
            code,
            engine=self.key.engine,
            output=text or "no output",
            log_name=self.log_path.name,
            memory_needed=self.memory or None,
        )

    def _signal_group(self, signum: int) -> None:
        process = self.process
        if process is None:
            return
        if process.returncode is None:  # the leader is not reaped yet, so its group id is still ours
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signum)
        else:
            signal_processes(group_members(process.pid, self.tag), signum)

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """End the engine's whole process group: SIGTERM (and SIGCONT, so that a stopped engine can act on
        it), SIGKILL after `grace` seconds (at once when grace is 0); returns when none of it is left."""
        self.state = RunnerState.STOPPING
        if self.idle_timer:
            self.idle_timer.cancel()
        if self.process is None:  # never started
            self.gone.set()
            return
        if grace > 0:
            self._signal_group(signal.SIGTERM)
            self._signal_group(signal.SIGCONT)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exited.wait(), grace)
        if not self.exited.is_set():
            self._signal_group(signal.SIGKILL)
        await self.gone.wait()

    def describe(self) -> dict[str, Any]:
        """The fields that name this runner in a log line."""
        return {"model": self.name, "engine": self.key.engine, "mode": self.key.mode.value, "pid": self.pid}


def end_orphans(pid_dir: Path) -> list[dict[str, Any]]:
    """End engines left by a daemon that died without stopping them (kill -9); returns their records.

    A record names the group leader's pid and the runner's tag; only processes that carry the tag are
    signalled, so a pid reused by an unrelated process is left alone. Records of older daemons have no tag:
    their leader is recognised by its socket path on its command line.
    """
    ended: list[dict[str, Any]] = []
    if not pid_dir.is_dir():
        return ended
    rundir.ensure_private_dir(pid_dir)
    for record_file in pid_dir.glob("*.json"):
        try:
            record = json.loads(rundir.read_private_file(record_file))
            pid, socket = int(record["pid"]), str(record["socket"])
        except (OSError, ValueError, KeyError, TypeError):
            record_file.unlink(missing_ok=True)
            continue
        tag = record.get("tag")
        if isinstance(tag, str):
            members = group_members(pid, tag)
        else:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
            except OSError:
                cmdline = ""
            members = [pid] if socket in cmdline else []
        if members:
            signal_processes(members, signal.SIGKILL)
            _wait_ended(members)
            ended.append({**record, "processes": len(members)})
        record_file.unlink(missing_ok=True)
    return ended


def _wait_ended(pids: list[int]) -> None:
    """A SIGKILL takes effect when the process next runs: wait (at most KILL_WAIT) until none of `pids` is
    left, so that what they held (memory, a GPU's, a port) is free before this daemon starts engines."""
    deadline = time.monotonic() + KILL_WAIT
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(GROUP_POLL)


def _alive(pid: int) -> bool:
    stat = process_stat(pid)
    return stat is not None and stat[0] != "Z"
