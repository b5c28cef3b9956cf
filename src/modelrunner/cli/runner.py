"""Daemon lifecycle verbs: serve, start-runner, stop-runner, restart-runner, version."""

from __future__ import annotations

import os
import signal
import time
from typing import Annotated

import typer

from modelrunner import __version__, config


def _stop_daemon() -> bool:
    from modelrunner.server.daemon import read_pid

    pid = read_pid()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    raise typer.Exit(code=1)


def _start_daemon() -> None:
    from modelrunner.client import Client, start_daemon_in_background, wait_until_up

    target = config.client_target()
    client = Client(target.base_url)
    if client.ping():
        typer.echo(f"The model runner is already running at {target.base_url}")
        return
    wait_until_up(client, start_daemon_in_background(), 30.0)
    typer.echo(f"The model runner is running at {target.base_url}")


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        host: Annotated[str, typer.Option(help="Address to listen on.")] = config.DEFAULT_HOST,
        port: Annotated[int | None, typer.Option(help="Port (default: MODEL_RUNNER_PORT or 12434).")] = None,
        models_path: Annotated[str | None, typer.Option("--models-path", help="Model store folder.")] = None,
    ) -> None:
        """Run the model runner daemon in the foreground."""
        from modelrunner.server.daemon import serve as run_daemon

        if models_path:
            os.environ["MODELS_PATH"] = models_path
        run_daemon(host, port if port is not None else config.daemon_port())

    @app.command("start-runner")
    def start_runner(
        port: Annotated[int | None, typer.Option(help="Port (default: MODEL_RUNNER_PORT or 12434).")] = None,
    ) -> None:
        """Start the model runner daemon in the background."""
        if port is not None:
            os.environ["MODEL_RUNNER_PORT"] = str(port)
        _start_daemon()

    @app.command("stop-runner")
    def stop_runner() -> None:
        """Stop the background model runner daemon."""
        if _stop_daemon():
            typer.echo("The model runner has stopped")
        else:
            typer.echo("The model runner is not running")

    @app.command("restart-runner")
    def restart_runner() -> None:
        """Stop, then start the background model runner daemon."""
        _stop_daemon()
        _start_daemon()

    @app.command()
    def version() -> None:
        """Show the client and server versions."""
        from modelrunner.client import DaemonError, connect

        typer.echo(f"Client: modelrunner {__version__}")
        try:
            server = connect(autostart=False).version()
            typer.echo(f"Server: modelrunner {server.get('version', '?')}")
        except DaemonError:
            typer.echo("Server: not running")
