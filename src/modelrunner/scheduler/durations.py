"""Keep-alive durations as DMR and Ollama users write them: "5m", "1h30m", "90s", 300, "0", "-1"."""

from __future__ import annotations

import re

from modelrunner.errors import BadRequest

NEVER = float("inf")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: object) -> float:
    """Seconds to keep an idle runner; 0 = unload as soon as idle; any negative value = never (inf)."""
    if isinstance(value, bool):
        raise BadRequest("keep_alive must be a duration such as 5m, 1h, 0 or -1")
    if isinstance(value, int | float):
        return NEVER if value < 0 else float(value)
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        raise BadRequest("keep_alive must be a duration such as 5m, 1h, 0 or -1")
    text = value.strip()
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return parse_keep_alive(float(text))
    negative = text.startswith("-")
    body = text.lstrip("+-")
    parts = _PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise BadRequest(f"invalid keep_alive duration {text[:40]!r}: use e.g. 5m, 1h30m, 0 or -1")
    seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    return NEVER if negative else seconds


def format_keep_alive(seconds: float) -> str:
    if seconds == NEVER:
        return "-1"
    whole = int(seconds)
    if whole and whole % 3600 == 0:
        return f"{whole // 3600}h"
    if whole and whole % 60 == 0:
        return f"{whole // 60}m"
    return f"{seconds:g}s"
