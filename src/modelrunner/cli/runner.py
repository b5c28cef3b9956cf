"""Daemon lifecycle verbs: serve, start-runner, stop-runner, restart-runner, version."""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any

from modelrunner import __version__, config


def _stop_daemon() -> bool:
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
    client = Client(target.base_url)
    if client.ping():
        print(f"The model runner is already running at {target.base_url}")
        return
    wait_until_up(client, start_daemon_in_background(), 30.0)
    print(f"The model runner is running at {target.base_url}")


def cmd_serve(args: argparse.Namespace) -> None:
    from modelrunner.server.daemon import serve

    if args.models_path:
        os.environ["MODELS_PATH"] = args.models_path
    serve(args.host, args.port if args.port is not None else config.daemon_port())


def cmd_start_runner(args: argparse.Namespace) -> None:
    if args.port is not None:
        os.environ["MODEL_RUNNER_PORT"] = str(args.port)
    _start_daemon()


def cmd_stop_runner(_: argparse.Namespace) -> None:
    print("The model runner has stopped" if _stop_daemon() else "The model runner is not running")


def cmd_restart_runner(_: argparse.Namespace) -> None:
    _stop_daemon()
    _start_daemon()


def cmd_version(_: argparse.Namespace) -> None:
    from modelrunner.client import connect
    from modelrunner.errors import DaemonError

    print(f"Client: modelrunner {__version__}")
    try:
        print(f"Server: modelrunner {connect(autostart=False).version().get('version', '?')}")
    except DaemonError:
        print("Server: not running")


def add_commands(commands: Any) -> None:
    serve = commands.add_parser("serve", help="Run the model runner daemon in the foreground.")
    serve.add_argument(
        "--host", default=config.DEFAULT_HOST, help="Address to listen on (default 127.0.0.1)."
    )
    serve.add_argument("--port", type=int, help="Port (default: MODEL_RUNNER_PORT or 12434).")
    serve.add_argument("--models-path", help="Model store folder (default: MODELS_PATH).")
    serve.set_defaults(handler=cmd_serve)

    start = commands.add_parser("start-runner", help="Start the model runner daemon in the background.")
    start.add_argument("--port", type=int, help="Port (default: MODEL_RUNNER_PORT or 12434).")
    start.set_defaults(handler=cmd_start_runner)

    commands.add_parser("stop-runner", help="Stop the background daemon.").set_defaults(
        handler=cmd_stop_runner
    )
    restart = commands.add_parser("restart-runner", help="Stop, then start the background daemon.")
    restart.set_defaults(handler=cmd_restart_runner)
    commands.add_parser("version", help="Show client and server versions.").set_defaults(handler=cmd_version)
