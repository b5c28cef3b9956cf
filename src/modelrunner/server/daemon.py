"""`model serve`: run the daemon in the foreground, with a pid file for start/stop-runner."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING

from modelrunner import config

if TYPE_CHECKING:
    import uvicorn

    from modelrunner.server.app import Daemon


def pid_file() -> Path:
    return config.runner_home() / "daemon.pid"


def read_pid() -> int | None:
    try:
        pid = int(pid_file().read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


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
    setup_logging()
    daemon = build_daemon(bind_host=host)
    path = pid_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))
    try:
        uvicorn.Server(uvicorn_config(daemon, host, port)).run()
    finally:
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) == os.getpid():
                path.unlink()
