"""Helpers shared by the CLI verbs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelrunner.client import Client


class UsageError(Exception):
    """A command line that parses but makes no sense (e.g. two sources for `package`): its message alone
    on stderr, exit code 1, as DMR's main prints a verb's error."""


class DmrArgs:
    """A verb whose DMR command checks its words and words its failures (cmd/cli/commands/utils.go):
    `requireExactArgs(n, verb, usage)`, or `requireMinArgs` when `at_least`, over the positionals named
    `names` (declared optional, so that this rule and not argparse judges the count); `failure`, the
    message handleClientError puts before a daemon's error (formatted with the parsed arguments).
    `counted=False` for a command without `Args` (cobra's legacyArgs takes any words; only its flags are
    checked). `cobra` names one of cobra's own validators instead, with its own texts: ("exact", n) for
    ExactArgs, ("min", n) for MinimumNArgs, ("max", n) for MaximumNArgs."""

    def __init__(
        self,
        verb: str,
        usage: str,
        *names: str,
        at_least: bool = False,
        failure: str | None = None,
        counted: bool = True,
        cobra: tuple[str, int] | None = None,
    ) -> None:
        self.verb, self.usage, self.names, self.at_least, self.failure = verb, usage, names, at_least, failure
        self.counted, self.cobra = counted, cobra

    def __eq__(self, other: object) -> bool:  # the same rule whichever parser built it
        return isinstance(other, DmrArgs) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]

    def count_error(self, prog: str, count: int) -> str | None:
        """DMR's text when `count` words do not fit the rule, with the command path as invoked."""
        if self.cobra is not None:
            return cobra_count_error(*self.cobra, count)
        if not self.counted:
            return None
        wanted = len(self.names) if not self.at_least else 1
        if (count >= wanted) if self.at_least else (count == wanted):
            return None
        path = f"{prog} {self.verb}"
        return (
            f"'{path}' requires {'at least ' if self.at_least else ''}{wanted} argument(s).\n\n"
            f"Usage:  {path} {self.usage}\n\n"
            f"See '{path} --help' for more information"
        )


def cobra_count_error(kind: str, n: int, count: int) -> str | None:
    """The texts of cobra's args.go validators (ExactArgs, MinimumNArgs, MaximumNArgs)."""
    if kind == "exact" and count != n:
        return f"accepts {n} arg(s), received {count}"
    if kind == "min" and count < n:
        return f"requires at least {n} arg(s), only received {count}"
    if kind == "max" and count > n:
        return f"accepts at most {n} arg(s), received {count}"
    return None


def takes(parser: Any, rule: DmrArgs) -> None:
    """Give a verb's parser its DMR rule (main applies it after parsing)."""
    parser.set_defaults(dmr_args=rule)


def client(quiet: bool = False) -> Client:
    """The daemon's client (started first when none runs); `quiet` for output that machines read."""
    from modelrunner.client import connect  # start-up: the client loads only for a verb that calls the daemon

    return connect(quiet=quiet)


def display(tag: str) -> str:
    from modelrunner.display import display_name  # start-up: config (pathlib, ipaddress) loads only when used

    return display_name(tag)


def short_id(model_id: str) -> str:
    return model_id.removeprefix("sha256:")[:12]
