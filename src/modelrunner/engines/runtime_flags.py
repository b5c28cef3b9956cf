"""The one check of the runtime flags users set through `model configure` (DMR's allow-lists, e.g.
`LlamaCppAllowedFlags`, `VLLMAllowedFlags`): each engine declares which flags it takes (`FlagRules`), and
every engine's are checked the same way. Values are checked too: a token with `/` or `\\` is refused (no
paths), and an inline `--flag=-x` value must be a negative number, so a second flag cannot be smuggled in
as a value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from modelrunner.errors import BadRequest

_NEGATIVE_NUMBER = re.compile(r"-(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


@dataclass(frozen=True)
class FlagRules:
    """The flags of one engine's command line that a user may set."""

    engine: str  # as the messages name it
    allowed: frozenset[str]
    # refused whatever their value, with the reason (none is allowed; the reason is the message)
    refused: Mapping[str, str] = field(default_factory=dict)

    def check(self, flags: Iterable[str]) -> None:
        """Raise BadRequest for a flag off the allow-list, a path-like value, or a non-numeric `--flag=-x`."""
        for token in flags:
            if "/" in token or "\\" in token:
                raise BadRequest(f"runtime flag {token!r} is not allowed: values may not contain '/' or '\\'")
            if "\0" in token:
                raise BadRequest("runtime flags may not contain NUL characters")
            if not token.startswith("-") or _NEGATIVE_NUMBER.fullmatch(token):
                continue  # a value, negative numbers included (`--seed -1`)
            name, sep, inline = token.partition("=")
            if name in self.refused:
                raise BadRequest(f"runtime flag {name!r} is not allowed: {self.refused[name]}")
            if name not in self.allowed:
                raise BadRequest(
                    f"runtime flag {name!r} is not allowed for {self.engine}; "
                    "see the allowed flags in the documentation of `model configure`"
                )
            if sep and inline.startswith("-") and not _NEGATIVE_NUMBER.fullmatch(inline):
                raise BadRequest(
                    f"runtime flag {token!r} is not allowed: a value starting with '-' must be a number"
                )


def no_flags(engine: str, flags: Iterable[str]) -> None:
    """The check of an engine that takes none (its server's command line is all the model runner's)."""
    if any(True for _ in flags):
        raise BadRequest(f"the {engine} engine takes no runtime flags")
