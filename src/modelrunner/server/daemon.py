"""`model serve`: run the daemon in the foreground, with a pid file for start/stop-runner.

It listens on its main address (127.0.0.1:12434), on extra addresses when told (for containers: the Docker
bridge gateway, as DMR is reached from them), on a Unix socket (MODEL_RUNNER_SOCK) and on DMR's TLS port
(MODEL_RUNNER_TLS_ENABLED); anything beyond loopback needs MODEL_RUNNER_API_KEY.

One daemon per runner home: it holds an exclusive lock on `<home>/daemon.lock` for its whole life and takes
it before anything else (logging, the store, ending orphaned engines, listening), so a second `model serve`
on the same home exits at once, naming the pid that holds it, and touches nothing of the running one.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Sequence
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


def setup_logging() -> None:
    """One structured line per event, to logs/daemon.log (served by /logs and `model logs`) and to stderr
    unless `MODEL_RUNNER_LOG_STDERR=0` (config.log_to_stderr)."""
    from modelrunner import eventlog

    eventlog.setup(config.logs_dir() / "daemon.log", stderr=config.log_to_stderr())


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
    from modelrunner.server.handed_over import HandedOver

    if front is None:
        front = fast_path_enabled()
    return uvicorn.Config(
        daemon.asgi,
        host=host,
        port=port,
        http=protocol_class(daemon.fast) if front else HandedOver,  # the front's stall and half-close rules
        lifespan="on",
        log_config=None,
        access_log=False,
        proxy_headers=False,  # the client's real address: it says who a caller is (server/localuser.py)
        timeout_graceful_shutdown=round(shutdown_grace()),  # what our drain (daemon_server) leaves
    )


def daemon_server(
    daemon: Daemon,
    main: uvicorn.Config,
    companions: Sequence[tuple[uvicorn.Config, socket.socket]] = (),
    grace: float | None = None,
) -> uvicorn.Server:
    """The daemon's uvicorn server: the HTTP front on the main TCP address and the extra ones (`--listen`,
    MODEL_RUNNER_EXTRA_LISTEN), and companion uvicorn servers with uvicorn's plain HTTP protocol for the Unix
    socket and the TLS port. The companions start after the main server's startup (which runs the
    application's lifespan) and stop with it; they share its signals.

    Shutdown first stops listening everywhere, then lets requests in progress finish for `grace` seconds
    and ends those still running the way their API ends a stream with an error (server/lifecycle.py:
    Lifecycle.drain), before uvicorn's own shutdown and the engines'."""
    import uvicorn

    seconds = shutdown_grace() if grace is None else grace
    others = [(uvicorn.Server(config), sock) for config, sock in companions]

    class DaemonServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            for server, sock in others:
                server.config.load()
                server.lifespan = server.config.lifespan_class(server.config)  # "off": a no-op
                await server.startup([sock])

        async def on_tick(self, counter: int) -> bool:
            for server, _ in others:
                await server.on_tick(counter)  # their Date headers
            return await super().on_tick(counter)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            started = time.monotonic()
            running = [self, *(server for server, _ in others if server.started)]
            for server in running:
                for listener in server.servers:
                    listener.close()
                for connection in list(server.server_state.connections):
                    connection.shutdown()  # idle connections close now, busy ones after their answer
            await daemon.lifecycle.drain(seconds)
            # the rest of the grace (and a moment for the requests just ended) for uvicorn's own wait
            left = max(2, round(seconds - (time.monotonic() - started)))
            for server in running:
                server.config.timeout_graceful_shutdown = left
            for server, sock in others:
                if server.started:
                    await server.shutdown([sock])
            await super().shutdown(sockets)

    return DaemonServer(main)


def bind_tcp(address: config.ListenAddress) -> socket.socket:
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.host, address.port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen on {address}: {exc.strerror or exc}") from None
    return sock


def bind_unix(path: Path) -> socket.socket:
    """A Unix socket only its owner may use (0600): DMR's MODEL_RUNNER_SOCK, made safer. A stale socket
    of an earlier run is replaced; any other file there is left alone."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SystemExit(f"cannot listen on {path}: a file that is not a socket is there")
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen on {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old_umask)
    return sock


def tls_files(tls: config.TLSSettings) -> tuple[Path, Path]:
    """The certificate and key of the TLS listener: given, or made for this runner home (DMR's rules)."""
    if tls.cert and tls.key:
        for path in (tls.cert, tls.key):
            if not path.is_file():
                raise SystemExit(f"TLS file not found: {path}")
        return tls.cert, tls.key
    if not tls.auto_cert:
        raise SystemExit(
            "TLS is enabled but no certificate was given: set MODEL_RUNNER_TLS_CERT and "
            "MODEL_RUNNER_TLS_KEY, or leave MODEL_RUNNER_TLS_AUTO_CERT on"
        )
    from modelrunner.errors import ModelRunnerError
    from modelrunner.server.tls import ensure_certificates

    try:
        return ensure_certificates(config.runner_home() / "certs")
    except ModelRunnerError as exc:
        raise SystemExit(exc.message) from None


def companion_config(daemon: Daemon, tls: tuple[Path, Path] | None = None) -> uvicorn.Config:
    """uvicorn's HTTP protocol with the front's stall and half-close rules (server/handed_over.py), not the
    front itself, for the Unix socket and the TLS port; the lifespan runs once, in the main server."""
    import uvicorn

    from modelrunner.server.handed_over import HandedOver

    return uvicorn.Config(
        daemon.asgi,
        http=HandedOver,
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,  # as in uvicorn_config
        timeout_graceful_shutdown=round(shutdown_grace()),
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
    )


def serve(
    host: str,
    port: int,
    extra: list[config.ListenAddress] | None = None,
    socket_path: Path | None = None,
) -> None:
    import uvicorn  # noqa: F401 - fail here, before anything is bound, if the server is missing

    from modelrunner import eventlog
    from modelrunner.scheduler.rundir import UnsafeRuntimeDir
    from modelrunner.server.app import build_daemon
    from modelrunner.server.fdlimit import raise_nofile_limit

    extra = extra or []
    beyond_loopback = [a.host for a in extra if not config.is_loopback_host(a.host)]
    if not config.is_loopback_host(host):
        beyond_loopback.insert(0, host)
    if beyond_loopback and not os.environ.get("MODEL_RUNNER_API_KEY"):
        raise SystemExit(
            f"refusing to listen on {beyond_loopback[0]} without an API key: set MODEL_RUNNER_API_KEY, "
            "or listen on loopback only"
        )
    try:
        lock = take_home_lock()  # first: a second daemon must not touch the running one's engines or files
    except AlreadyRunning as exc:
        print(f"model serve: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        tls = config.tls_settings()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    setup_logging()
    log = logging.getLogger("modelrunner.server")
    eventlog.event(log, "open_files_limit", soft=raise_nofile_limit())  # before the front sizes itself on it
    try:
        daemon = build_daemon(bind_host=host, extra_listen=extra)
    except UnsafeRuntimeDir as exc:
        raise SystemExit(f"model serve: {exc.message}") from None
    main = config.ListenAddress(host, port)
    sockets = [bind_tcp(main), *(bind_tcp(address) for address in extra)]
    companions: list[tuple[uvicorn.Config, socket.socket]] = []
    if socket_path is not None:
        companions.append((companion_config(daemon), bind_unix(socket_path)))
    if tls.enabled:
        files = tls_files(tls)
        companions.append((companion_config(daemon, files), bind_tcp(config.ListenAddress(host, tls.port))))
    for address in (main, *extra):
        eventlog.event(log, "listening", address=f"http://{address}")
    if socket_path is not None:
        eventlog.event(log, "listening", address=f"unix://{socket_path}")
    if tls.enabled:
        eventlog.event(log, "listening", address=f"https://{config.ListenAddress(host, tls.port)}")
    path = pid_file()
    path.write_text(str(os.getpid()))
    server = daemon_server(daemon, uvicorn_config(daemon, host, port), companions)
    stopped_by = pass_on_sigterm(server)
    try:
        server.run(sockets=sockets)
    finally:
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) == os.getpid():
                path.unlink()
        if socket_path is not None:
            with contextlib.suppress(OSError):
                socket_path.unlink()
        os.close(lock)
    if stopped_by:  # now that its files are gone, the daemon ends by the signal, as uvicorn meant it to
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


def pass_on_sigterm(server: uvicorn.Server) -> list[int]:
    """A SIGTERM handler for uvicorn to find. uvicorn stops gracefully on SIGTERM, then sends the signal again
    to the handler it found (`Server.capture_signals`): with Python's default there, the process died inside
    the event loop, before serve()'s clean-up, and left `daemon.pid` behind (which `model stop-runner` would
    later signal, whatever process had that pid by then). This one notes the signal for serve() to end by
    after its clean-up; a SIGTERM before uvicorn has its own handler ends the start at once."""
    stopped_by: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if not server.should_exit:
            raise SystemExit(128 + signum)
        stopped_by.append(signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
    return stopped_by
