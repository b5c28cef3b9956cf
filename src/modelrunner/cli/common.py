"""Helpers shared by the CLI verbs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modelrunner.client import Client


class UsageError(Exception):
    """A command line that parses but makes no sense (e.g. two sources for `package`); exit code 2."""


def client(quiet: bool = False) -> Client:
    """The daemon's client (started first when none runs); `quiet` for output that machines read."""
    from modelrunner.client import connect

    return connect(quiet=quiet)


def display(tag: str) -> str:
    from modelrunner.display import display_name

    return display_name(tag)


def short_id(model_id: str) -> str:
    return model_id.removeprefix("sha256:")[:12]
