"""Keep-alive durations as DMR and Ollama users write them: "5m", "1h30m", "90s", 300, "0", "-1".

Every route reads `keep_alive` through `parse_keep_alive`, so what it refuses (NaN, infinities, values
beyond Go's largest duration, which DMR could not represent either) no route accepts: such a value would
reach `loop.call_later` and break the runner's idle timer.
"""

from __future__ import annotations

import math
import re

from modelrunner.errors import BadRequest

NEVER = float("inf")
MAX_SECONDS = (2**63 - 1) / 1e9  # Go's time.Duration is int64 nanoseconds: about 292 years
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_HINT = "use e.g. 5m, 1h30m, 0 (unload when idle) or -1 (never)"


def parse_keep_alive(value: object) -> float:
    """Seconds to keep an idle runner; 0 = unload as soon as idle; any negative value = never (inf)."""
    if isinstance(value, bool):
        raise BadRequest(f"keep_alive must be a duration: {_HINT}")
    if isinstance(value, int | float):
        return _seconds(float(value), repr(value))
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        raise BadRequest(f"keep_alive must be a duration: {_HINT}")
    text = value.strip()
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return _seconds(float(text), text)
    negative = text.startswith("-")
    body = text.lstrip("+-")
    parts = _PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise BadRequest(f"invalid keep_alive duration {text[:40]!r}: {_HINT}")
    seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    return _seconds(-seconds if negative else seconds, text)


def _seconds(seconds: float, shown: str) -> float:
    if math.isnan(seconds) or math.isinf(seconds) or abs(seconds) > MAX_SECONDS:
        raise BadRequest(f"invalid keep_alive {shown[:40]!r}: {_HINT} (at most 292 years)")
    return NEVER if seconds < 0 else seconds


def format_keep_alive(seconds: float) -> str:
    if seconds == NEVER:
        return "-1"
    whole = int(seconds)
    if whole and whole % 3600 == 0:
        return f"{whole // 3600}h"
    if whole and whole % 60 == 0:
        return f"{whole // 60}m"
    return f"{seconds:g}s"


def go_duration(seconds: float) -> str:
    """`seconds` as DMR's KeepAlive marshals it: Go's `time.Duration.String()` ("5m0s", "1h30m0s",
    "1.5s", "0s"), and "-1" for never (pkg/inference/backend.go)."""
    if seconds == NEVER or seconds < 0:
        return "-1"
    nanos = round(seconds * 1e9)
    if nanos == 0:
        return "0s"
    if nanos < 1_000_000_000:  # below one second Go picks the largest unit that keeps it >= 1
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if nanos >= size:
                return _trim(nanos / size) + unit
    hours, rest = divmod(nanos, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _trim(rest / 1e9) + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def _trim(value: float) -> str:
    return f"{value:.9f}".rstrip("0").rstrip(".")
