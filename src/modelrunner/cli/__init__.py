"""The `model` command: thin verbs that parse, call the daemon through client.py, and render."""

from __future__ import annotations

import sys

import typer

from modelrunner.cli import models, runner

app = typer.Typer(
    name="model",
    help="Run, manage and package AI models locally (Docker Model Runner compatible).",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
models.register(app)
runner.register(app)


def main() -> None:
    from modelrunner.client import DaemonError
    from modelrunner.errors import ModelRunnerError

    try:
        app()
    except DaemonError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        sys.exit(1)
    except ModelRunnerError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        sys.exit(1)
