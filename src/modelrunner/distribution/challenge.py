"""`WWW-Authenticate` challenges (RFC 7235) as registries send them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')


@dataclass(frozen=True)
class Challenge:
    scheme: str  # lowercased: "bearer" or "basic"
    params: dict[str, str] = field(default_factory=dict)

    @property
    def realm(self) -> str | None:
        return self.params.get("realm")

    @property
    def insufficient_scope(self) -> bool:
        return self.params.get("error") == "insufficient_scope"


def parse_challenge(header: str | None) -> Challenge | None:
    """The first challenge of a header; None when there is none we understand."""
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() not in ("bearer", "basic"):
        return None
    params: dict[str, str] = {}
    position = 0
    while position < len(rest):
        match = _PARAM.match(rest, position)
        if not match or match.end() == position:
            break
        quoted, bare = match.group(2), match.group(3)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare or ""
        params[match.group(1).lower()] = value
        position = match.end()
    return Challenge(scheme.lower(), params)
