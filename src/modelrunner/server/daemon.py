"""`model serve`: run the daemon in the foreground, with a pid file for start/stop-runner.

One daemon per runner home: it holds an exclusive lock on `<home>/daemon.lock` for its whole life and takes
it before anything else (logging, the store, ending orphaned engines, listening), so a second `model serve`
on the same home exits at once, naming the pid that holds it, and touches nothing of the running one.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from modelrunner import config

if TYPE_CHECKING:
    import uvicorn

    from modelrunner.server.app import Daemon


def pid_file() -> Path:
    return config.runner_home() / "daemon.pid"


def lock_file() -> Path:
    return config.runner_home() / "daemon.lock"


class AlreadyRunning(Exception):
    def __init__(self, pid: int | None) -> None:
        holder = f"pid {pid}" if pid else "another process"
        super().__init__(
            f"a model runner ({holder}) is already running for {config.runner_home()}; "
            "stop it first (model stop-runner), or set MODEL_RUNNER_HOME to run another one"
        )
        self.pid = pid


def take_home_lock() -> int:
    """Lock the runner home for this process's life (the descriptor stays open; flock ends with the
    process, also on kill -9) and write our pid into the lock file; AlreadyRunning if another holds it."""
    path = lock_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by engines (O_CLOEXEC by default)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = int(os.pread(fd, 32, 0).decode().strip() or 0) or None
        except (OSError, ValueError):
            holder = None
        os.close(fd)
        raise AlreadyRunning(holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def read_pid() -> int | None:
    try:
        pid = int(pid_file().read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if is_running(pid) else None


def is_running(pid: int) -> bool:
    """Whether the process exists and has not exited (an exited one may linger as a zombie until its
    parent reaps it: it holds no lock or port any more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: existing is all we can tell
    return not stat[stat.rfind(")") + 2 :].startswith(("Z", "X"))


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def setup_logging() -> None:
    """One structured line per event, to stderr and to logs/daemon.log (served by /logs and `model logs`)."""
    from modelrunner import eventlog

    eventlog.setup(config.logs_dir() / "daemon.log")


def uvicorn_config(daemon: Daemon, host: str, port: int, front: bool = True) -> uvicorn.Config:
    """How the daemon is served: uvicorn with the HTTP front (server/front.py) taking plain inference
    requests; `front=False` leaves every request to the ASGI stack (tests of that path)."""
    import uvicorn

    from modelrunner.server.front import protocol_class

    return uvicorn.Config(
        daemon.asgi,
        host=host,
        port=port,
        http=protocol_class(daemon.fast) if front else "httptools",
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
    )


def serve(host: str, port: int) -> None:
    import uvicorn

    from modelrunner.server.app import build_daemon

    if not is_loopback_host(host) and not os.environ.get("MODEL_RUNNER_API_KEY"):
        raise SystemExit(
            f"refusing to listen on {host} without an API key: set MODEL_RUNNER_API_KEY, or bind 127.0.0.1"
        )
    try:
        lock = take_home_lock()  # first: a second daemon must not touch the running one's engines or files
    except AlreadyRunning as exc:
        print(f"model serve: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    setup_logging()
    daemon = build_daemon(bind_host=host)  # its start-up ends engines orphaned by a killed predecessor
    path = pid_file()
    path.write_text(str(os.getpid()))
    try:
        uvicorn.Server(uvicorn_config(daemon, host, port)).run()
    finally:
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) == os.getpid():
                path.unlink()
        os.close(lock)
