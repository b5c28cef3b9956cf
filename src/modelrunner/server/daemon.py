"""`model serve`: run the daemon in the foreground, with a pid file for start/stop-runner."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from pathlib import Path

from modelrunner import config


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


def serve(host: str, port: int) -> None:
    import uvicorn

    from modelrunner.server.app import create_app

    app = create_app()
    path = pid_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))
    try:
        uvicorn.run(
            app, host=host, port=port, log_level="info", access_log=False, timeout_graceful_shutdown=10
        )
    finally:
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) == os.getpid():
                path.unlink()
