"""The `model` command: thin verbs that parse, call the daemon through client.py, and render.

Built on argparse: `model --help` and `model ls` must feel instant, and typer (0.29) costs ~0.45 s of
imports per invocation (it loads pydantic), click ~0.1 s, argparse ~0.02 s.
"""

from __future__ import annotations

import argparse
import sys

from modelrunner import __version__
from modelrunner.cli import (
    bench,
    compose,
    context,
    distribution,
    engines,
    generate,
    inference,
    models,
    plugin,
    requests,
    runner,
    worker,
)
from modelrunner.cli.common import UsageError


def build_parser(prog: str = "model") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run, manage and package AI models locally (Docker Model Runner compatible).",
    )
    parser.add_argument("--version", action="version", version=f"modelrunner {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    models.add_commands(commands)
    inference.add_commands(commands)
    bench.add_commands(commands)
    runner.add_commands(commands)
    distribution.add_commands(commands)
    engines.add_commands(commands)
    context.add_commands(commands)
    compose.add_commands(commands)
    plugin.add_commands(commands)
    worker.add_commands(commands)
    generate.add_commands(commands)
    requests.add_commands(commands)
    return parser


def main(argv: list[str] | None = None, prog: str = "model") -> None:
    from modelrunner.errors import ModelRunnerError

    parser = build_parser(prog)
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` is passed through untouched (engine flags of `configure`); argparse's own
    # handling of `--` inside subcommands is unreliable, so it is split off here.
    passthrough: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, passthrough = words[:at], words[at + 1 :]
    args, leftover = parser.parse_known_args(words)
    # `model run MODEL --max-tokens 9 "a prompt"`: words after an option still belong to the prompt.
    extra_field = getattr(args, "extra_words_to", None)
    if leftover and extra_field and not any(word.startswith("-") for word in leftover):
        setattr(args, extra_field, [*getattr(args, extra_field), *leftover])
    elif leftover:
        parser.error(f"unrecognized arguments: {' '.join(leftover)}")
    if passthrough and not getattr(args, "accepts_passthrough", False):
        parser.error("arguments after -- are only accepted by: configure")
    args.passthrough = passthrough
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        sys.exit(0 if argv is None and len(sys.argv) == 1 else 2)
    try:
        sys.exit(handler(args) or 0)
    except UsageError as exc:
        parser.exit(2, f"{prog}: error: {exc}\n")
    except ModelRunnerError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
