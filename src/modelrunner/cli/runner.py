"""Daemon lifecycle verbs: serve, start-runner, stop-runner, restart-runner, version."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from modelrunner import __version__, config


def _stop_daemon() -> bool:
    import signal

    from modelrunner.server.daemon import is_running, read_pid

    pid = read_pid()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not is_running(pid):
            return True
        time.sleep(0.05)
    raise TimeoutError("the model runner did not stop within 30 s")


def _start_daemon() -> None:
    from modelrunner.client import Client, start_daemon_in_background, wait_until_up

    target = config.client_target()
    client = Client.for_target(target)
    if client.ping():
        print(f"The model runner is already running at {target.base_url}")
        return
    wait_until_up(client, start_daemon_in_background(tls=target.base_url.startswith("https:")))
    print(f"The model runner is running at {target.base_url}")


def cmd_serve(args: argparse.Namespace) -> None:
    from modelrunner.server.daemon import serve

    if args.models_path:
        os.environ["MODELS_PATH"] = args.models_path
    port = args.port if args.port is not None else config.daemon_port()
    try:
        extra = config.extra_listen_addresses(port)
        extra += [config.parse_listen_address(item, port) for item in args.listen]
    except ValueError as exc:
        raise SystemExit(f"model serve: {exc}") from None
    socket_path = Path(args.socket).expanduser() if args.socket else config.unix_socket_path()
    serve(args.host, port, extra=extra, socket_path=socket_path)


def cmd_start_runner(args: argparse.Namespace) -> None:
    if args.port is not None:
        os.environ["MODEL_RUNNER_PORT"] = str(args.port)
    _start_daemon()


def cmd_stop_runner(args: argparse.Namespace) -> None:
    from modelrunner.cli.models import confirm_removing_every_model

    if args.models and not confirm_removing_every_model(args.force):
        return  # declined: nothing is done, the runner keeps running
    if args.models:  # DMR: "Remove model storage volume"
        _purge_models()
    print("The model runner has stopped" if _stop_daemon() else "The model runner is not running")


def _purge_models() -> None:
    """Every model removed: through the running daemon (runners unloaded first), else in the store."""
    from modelrunner.client import Client
    from modelrunner.errors import DaemonError

    daemon = Client.for_target(config.client_target())
    try:
        daemon.unload([], True, None)
        daemon.purge()
    except DaemonError as exc:
        if exc.status_code != 0:
            raise
        from modelrunner.store.store import ModelStore

        ModelStore(config.models_path()).purge()
    print("Removed every model from the store")


def cmd_restart_runner(_: argparse.Namespace) -> None:
    _stop_daemon()
    _start_daemon()


def _os_arch() -> str:
    """As Go names them (runtime.GOOS/GOARCH)."""
    import platform

    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "aarch64": "arm64", "i386": "386", "i686": "386"}.get(machine, machine)
    return f"{platform.system().lower()}/{arch}"


def cmd_version(_: argparse.Namespace) -> None:
    """DMR's `version` layout: the client, then the server it reaches and the engine kind."""
    from modelrunner.client import connect
    from modelrunner.errors import DaemonError

    print("Client:")
    print(f" Version:    {__version__} (modelrunner)")
    print(f" OS/Arch:    {_os_arch()}")
    print()
    print("Server:")
    try:
        print(f" Version:    {connect(autostart=False).version().version or '?'}")
        print(" Engine:     Docker Engine (Manual Install)")
    except DaemonError:
        print(" Version:    (not reachable)")
        print(" Engine:     (not reachable)")


def add_commands(commands: Any) -> None:
    serve = commands.add_parser("serve", help="Run the model runner daemon in the foreground.")
    serve.add_argument(
        "--host", default=config.DEFAULT_HOST, help="Address to listen on (default 127.0.0.1)."
    )
    serve.add_argument("--port", type=int, help="Port (default: MODEL_RUNNER_PORT or 12434).")
    serve.add_argument("--models-path", help="Model store folder (default: MODELS_PATH).")
    serve.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="ADDR[:PORT]",
        help="also listen here, e.g. the Docker bridge gateway 172.17.0.1 (repeatable; beyond loopback "
        "MODEL_RUNNER_API_KEY is required); MODEL_RUNNER_EXTRA_LISTEN is a comma list of the same",
    )
    serve.add_argument(
        "--socket", metavar="PATH", help="also listen on this Unix socket (default: MODEL_RUNNER_SOCK)"
    )
    serve.set_defaults(handler=cmd_serve)

    start = commands.add_parser("start-runner", help="Start the model runner daemon in the background.")
    start.add_argument("--port", type=int, help="Port (default: MODEL_RUNNER_PORT or 12434).")
    start.set_defaults(handler=cmd_start_runner)

    stop = commands.add_parser("stop-runner", help="Stop the background daemon.")
    stop.add_argument(
        "--models", action="store_true", help="also remove every model from the store (asks first)"
    )
    stop.add_argument("-f", "--force", action="store_true", help="with --models: do not ask")
    stop.set_defaults(handler=cmd_stop_runner)
    restart = commands.add_parser("restart-runner", help="Stop, then start the background daemon.")
    restart.set_defaults(handler=cmd_restart_runner)
    commands.add_parser("version", help="Show client and server versions.").set_defaults(handler=cmd_version)
