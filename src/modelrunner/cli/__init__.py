"""The `model` command: thin verbs that parse, call the daemon through client.py, and render.

Built on argparse: `model --help` and `model ls` must feel instant, and typer (0.29) costs ~0.45 s of
imports per invocation (it loads pydantic), click ~0.1 s, argparse ~0.02 s. For the same reason a verb
imports only its own command module, and a command module imports at its top only what registering its
verbs needs: what a handler needs (rich, the artifact builder, even datetime or threading) it imports when
it runs. tests/integration/test_cli_startup.py lists what must stay off the start-up path.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import import_module
from typing import Any, NoReturn

from modelrunner import __version__
from modelrunner.cli.common import DmrArgs, UsageError

# The command modules (modelrunner.cli.<name>), in the order `model --help` lists their verbs, each with
# the verbs and aliases its add_commands(commands) registers. Running a verb builds only the parsers of
# the module that registers it (argparse spends ~0.4 ms on each verb's parser, and a module's imports
# cost more); `--help`, or a verb missing here, builds them all. A new verb: register it in its module's
# add_commands and name it here; a new module: one more entry.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "models": ("package", "list", "ls", "inspect", "show", "tag", "rm", "export", "load", "df", "purge"),
    "inference": ("run", "ps", "unload", "stop", "configure", "config", "logs"),
    "bench": ("bench",),
    "runner": ("serve", "start-runner", "stop-runner", "restart-runner", "version"),
    "distribution": ("pull", "push"),
    "search": ("search",),
    "launch": ("launch",),
    "engines": ("install-runner", "reinstall-runner", "uninstall-runner", "status"),
    "context": ("context",),
    "compose": ("compose",),
    "plugin": ("install-plugin",),
    "worker": ("worker",),
    "generate": ("generate",),
    "requests": ("requests",),
    "gateway": ("gateway",),
    "skills": ("skills",),
    "trust": ("trust", "sign", "verify"),
}


# Verbs that `--help` does not list (DMR hides `compose`: Docker Compose runs it, not people)
HIDDEN_VERBS = ("compose",)


def _terminal_columns() -> int:
    """The width shutil.get_terminal_size gives argparse: COLUMNS, else the terminal's, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, the terminal measured here: argparse makes a formatter for every
    add_argument (to check its metavar) and imports shutil to measure the terminal, which with the
    compression modules shutil loads costs ~2.5 ms of every command's start."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        width = _terminal_columns() - 2 if width is None else width  # as argparse's own
        super().__init__(prog, indent_increment, max_help_position, width)


class _Parser(argparse.ArgumentParser):
    """ArgumentParser with that formatter and without abbreviated options (pflag takes `--context-size`,
    never `--conte`); add_subparsers makes the verbs' parsers of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """A flag that argparse could not read, as DMR's cobra reports it: pflag's words where argparse's
        have a match, docker/cli's FlagErrorFunc usage hint after them, exit 1 (DMR's main exits 1 on every
        error; argparse's own is 2)."""
        rule: DmrArgs | None = self._defaults.get("dmr_args")
        _fail(_flag_error(_pflag_words(message), self.prog, rule.usage if rule is not None else None))


def _pflag_words(message: str) -> str:
    """pflag's text for argparse's: `flag needs an argument: --x`, `invalid argument "v" for "--x" flag:
    parsing "v": invalid syntax` (the tail of Go's strconv error); other messages as argparse says them."""
    import re

    missing = re.fullmatch(r"argument (-[^\s/:]+)\S*: expected one argument", message)
    if missing:
        return f"flag needs an argument: {missing[1]}"
    invalid = re.fullmatch(r"argument (-[^\s/:]+)\S*: (?:invalid \w+ value|not a \w+): '(.*)'", message)
    if invalid:
        value = invalid[2].replace('"', '\\"')
        return f'invalid argument "{value}" for "{invalid[1]}" flag: parsing "{value}": invalid syntax'
    return message


def _flag_error(problem: str, path: str, usage: str | None) -> str:
    """docker/cli's FlagErrorFunc: the problem, the command's use line, and where its help is."""
    use = f"\n\nUsage:  {f'{path} {usage}'.rstrip()}" if usage is not None else ""
    return f"{problem}{use}\n\nRun '{path} --help' for more information"


def build_parser(prog: str = "model", verb: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every verb's, or with `verb` only those of the module that has it (all
    that parsing a command line of that verb needs)."""
    parser = _Parser(
        prog=prog,
        description="Run, manage and package AI models locally (Docker Model Runner compatible).",
    )
    parser.add_argument("--version", action="version", version=f"modelrunner {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    modules = [name for name, verbs in COMMAND_MODULES.items() if verb in verbs] or list(COMMAND_MODULES)
    for name in modules:
        import_module(f"modelrunner.cli.{name}").add_commands(commands)
    return parser


# Verbs of other tools a user may type here, and ours that do the same (cobra's SuggestFor): Ollama's
# `cp` and `create`, docker's `images` and `rmi`.
SUGGEST_FOR = {"cp": "tag", "create": "package", "images": "ls", "rmi": "rm", "delete": "rm", "remove": "rm"}


def unknown_command(word: str, prog: str) -> str:
    """cobra's words for a command it does not have (command.go: `unknown command %q for %q` and
    findSuggestions' "Did you mean this?"), then its hint to the help. Standalone DMR says this; under
    docker it prints its help and exits 0, which a script cannot tell from success."""
    import difflib
    import json  # Go's %q, near enough

    verbs = [verb for verbs in COMMAND_MODULES.values() for verb in verbs if verb not in HIDDEN_VERBS]
    suggestions = [SUGGEST_FOR[word]] if word in SUGGEST_FOR else difflib.get_close_matches(word, verbs, n=3)
    lines = [f"unknown command {json.dumps(word)} for {json.dumps(prog)}", ""]
    if suggestions:
        lines += ["Did you mean this?", *(f"\t{verb}" for verb in suggestions), ""]
    return "\n".join([*lines, f"Run '{prog} --help' for usage."])


def _fail(message: str) -> NoReturn:
    """A usage error as DMR's CLI reports it: the text alone on stderr, exit code 1 (its main's)."""
    print(message, file=sys.stderr)
    sys.exit(1)


def _apply_dmr_args(rule: DmrArgs, prog: str, args: argparse.Namespace, leftover: list[str]) -> list[str]:
    """Check a verb's words as DMR's cobra command does: an unknown flag first (pflag's text, then the
    usage line of docker/cli's FlagErrorFunc), then the number of words (requireExactArgs /
    requireMinArgs). The words left over after an option join the verb's (the last name takes them)."""
    path = f"{prog} {rule.verb}"
    for word in leftover:
        if word.startswith("--"):
            problem = f"unknown flag: {word.partition('=')[0]}"
        elif word.startswith("-") and len(word) > 1:
            problem = f"unknown shorthand flag: {word[1]!r} in {word}"
        else:
            continue
        _fail(_flag_error(problem, path, rule.usage))  # cobra's UseLine, flags left out as docker/cli does
    values = [getattr(args, name) for name in rule.names]
    words = [w for value in values for w in (value if isinstance(value, list) else [value]) if w is not None]
    error = rule.count_error(prog, len(words) + len(leftover))
    if error is not None:
        _fail(error)
    if rule.at_least:
        setattr(args, rule.names[-1], [*(getattr(args, rule.names[-1]) or []), *leftover])
    return []


def main(argv: list[str] | None = None, prog: str = "model") -> None:
    from modelrunner.errors import ModelRunnerError

    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` is passed through untouched (engine flags of `configure`); argparse's own
    # handling of `--` inside subcommands is unreliable, so it is split off here.
    passthrough: list[str] = []
    dashed = "--" in words  # `launch` words its errors by whether `--` was given
    if dashed:
        at = words.index("--")
        words, passthrough = words[:at], words[at + 1 :]
    if words[:1] == ["help"]:  # cobra's own `help [COMMAND]`: that command's --help
        words = [*words[1:2], "--help"]
    # the verb comes first (the top level's options, --help and --version, take no value)
    verb = words[0] if words and not words[0].startswith("-") else None
    parser = build_parser(prog, verb)
    if verb is not None and not any(verb in verbs for verbs in COMMAND_MODULES.values()):
        _fail(unknown_command(verb, prog))
    args, leftover = parser.parse_known_args(words)
    rule: DmrArgs | None = getattr(args, "dmr_args", None)
    if rule is not None:
        leftover = _apply_dmr_args(rule, prog, args, leftover)
    if leftover:
        parser.error(f"unrecognized arguments: {' '.join(leftover)}")
    if passthrough and not getattr(args, "accepts_passthrough", False):
        parser.error("arguments after -- are only accepted by: configure, launch")
    args.passthrough, args.dashed, args.prog = passthrough, dashed, prog
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        sys.exit(0 if argv is None and len(sys.argv) == 1 else 2)
    try:
        sys.exit(handler(args) or 0)
    except UsageError as exc:  # as DMR's main prints any verb's error: as it is, exit 1
        _fail(str(exc))
    except ModelRunnerError as exc:
        # DMR's main prints its error as it is: the verb's handleClientError message before the cause
        failure = rule.failure.format(**vars(args)) if rule is not None and rule.failure else "Error"
        print(f"{failure}: {exc.message}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
