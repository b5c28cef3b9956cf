"""`model serve`: run the daemon in the foreground, with a pid file for start/stop-runner."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
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


def setup_logging() -> None:
    """One line per event, to stderr and to logs/daemon.log (served by /logs and `model logs`)."""
    log_dir = config.logs_dir()
    log_dir.mkdir(parents=True, exist_ok=True)
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S%z")
    handlers: list[logging.Handler] = [logging.StreamHandler(), logging.FileHandler(log_dir / "daemon.log")]
    root = logging.getLogger()
    root.handlers.clear()
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(os.environ.get("LOG_LEVEL", "INFO").upper())


def serve(host: str, port: int) -> None:
    import uvicorn

    from modelrunner.server.app import create_app

    if not is_loopback_host(host) and not os.environ.get("MODEL_RUNNER_API_KEY"):
        raise SystemExit(
            f"refusing to listen on {host} without an API key: set MODEL_RUNNER_API_KEY, or bind 127.0.0.1"
        )
    setup_logging()
    app = create_app(bind_host=host)
    path = pid_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))
    try:
        uvicorn.run(
            app, host=host, port=port, log_config=None, access_log=False, timeout_graceful_shutdown=10
        )
    finally:
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) == os.getpid():
                path.unlink()
