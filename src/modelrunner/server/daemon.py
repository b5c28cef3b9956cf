"""`model serve`: run the daemon in the foreground, with a pid file for start/stop-runner."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import time
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


def fast_path_enabled() -> bool:
    """`MODEL_RUNNER_FAST_PATH=0` sends every request through the ASGI stack (no HTTP front)."""
    return os.environ.get("MODEL_RUNNER_FAST_PATH", "1").strip().lower() not in ("0", "false", "no", "off")


def shutdown_grace() -> float:
    """Seconds requests in progress get to finish at shutdown (`MODEL_RUNNER_SHUTDOWN_GRACE`, 10)."""
    raw = os.environ.get("MODEL_RUNNER_SHUTDOWN_GRACE", "").strip()
    try:
        grace = float(raw) if raw else 10.0
    except ValueError:
        raise SystemExit(f"MODEL_RUNNER_SHUTDOWN_GRACE must be a number of seconds, got {raw!r}") from None
    if not 0 <= grace <= 3600:
        raise SystemExit("MODEL_RUNNER_SHUTDOWN_GRACE must be between 0 and 3600 seconds")
    return grace


def uvicorn_config(daemon: Daemon, host: str, port: int, front: bool | None = None) -> uvicorn.Config:
    """How the daemon is served: uvicorn with the HTTP front (server/front.py) taking plain inference
    requests; `front=False` (or MODEL_RUNNER_FAST_PATH=0) leaves every request to the ASGI stack."""
    import uvicorn

    from modelrunner.server.front import protocol_class

    if front is None:
        front = fast_path_enabled()
    return uvicorn.Config(
        daemon.asgi,
        host=host,
        port=port,
        http=protocol_class(daemon.fast) if front else "httptools",
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=round(shutdown_grace()),  # what our drain (daemon_server) leaves
    )


def daemon_server(daemon: Daemon, config: uvicorn.Config, grace: float | None = None) -> uvicorn.Server:
    """uvicorn's server, with a shutdown that first stops listening, then lets requests in progress
    finish for `grace` seconds and ends those still running the way their API ends a stream with an
    error (server/lifecycle.py: Lifecycle.drain), before uvicorn's own shutdown and the engines'."""
    import uvicorn

    seconds = shutdown_grace() if grace is None else grace

    class DaemonServer(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            started = time.monotonic()
            for server in self.servers:
                server.close()
            for connection in list(self.server_state.connections):
                connection.shutdown()  # idle connections close now, busy ones after their answer
            await daemon.lifecycle.drain(seconds)
            # the rest of the grace (and a moment for the requests just ended) for uvicorn's own wait
            self.config.timeout_graceful_shutdown = max(2, round(seconds - (time.monotonic() - started)))
            await super().shutdown(sockets)

    return DaemonServer(config)


def serve(host: str, port: int) -> None:
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
        daemon_server(daemon, uvicorn_config(daemon, host, port)).run()
    finally:
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) == os.getpid():
                path.unlink()
