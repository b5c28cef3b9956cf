"""The CLI builds only the parsers of the verb it runs (cli/__init__.py's COMMAND_MODULES): the table must
name every verb each module registers, in --help's order, and a command line must parse the same way with
the verb's module alone as with every module."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from modelrunner.cli import COMMAND_MODULES, build_parser


def verbs(parser: argparse.ArgumentParser) -> list[str]:
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(commands.choices)


@pytest.mark.parametrize("module", list(COMMAND_MODULES))
def test_each_module_registers_the_verbs_the_table_names(module: str) -> None:
    registered = COMMAND_MODULES[module]
    for verb in registered:
        assert verbs(build_parser(verb=verb)) == list(registered)


def test_help_lists_every_verb_in_the_tables_order() -> None:
    everything = [verb for registered in COMMAND_MODULES.values() for verb in registered]
    assert verbs(build_parser()) == everything
    assert verbs(build_parser(verb="no-such-verb")) == everything  # an unknown verb: argparse's error


def parsed(parser: argparse.ArgumentParser, words: list[str]) -> dict[str, Any]:
    args, leftover = parser.parse_known_args(words)
    values = vars(args)
    if "handler" in values:  # the same function (`context`'s is a lambda made with its parser)
        values["handler"] = values["handler"].__qualname__
    return {**values, "leftover": leftover}


@pytest.mark.parametrize(
    "words",
    [
        ["ls"],
        ["list", "--json", "smol"],
        ["ps"],
        ["status", "--json"],
        ["run", "ai/smollm2", "--max-tokens", "9", "hello", "there"],
        ["configure", "--context-size", "4096", "ai/x"],
        ["stop", "--all"],
        ["context", "create", "lab", "--host", "http://10.0.0.5:12434"],
        ["compose", "--project-name", "p", "up", "--model", "ai/x", "svc"],
        ["worker", "--port", "50053"],
        ["generate", "kube", "--replicas", "2"],
        ["package", "--gguf", "/m.gguf", "org/m:v1"],
    ],
)
def test_a_command_line_parses_alike_with_its_module_alone(words: list[str]) -> None:
    assert parsed(build_parser(verb=words[0]), words) == parsed(build_parser(), words)


def test_the_worker_port_is_the_engines() -> None:
    """cli/worker.py names the RPC worker's default port itself, so that registering the verb does not
    import the engine modules."""
    from modelrunner.cli import worker
    from modelrunner.engines import rpc_workers

    assert worker.DEFAULT_PORT == rpc_workers.DEFAULT_PORT
