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
    """As DMR's KeepAlive marshals itself: "-1" for never, else Go's duration format ("5m0s")."""
    return "-1" if seconds == NEVER else go_duration(seconds)


def go_duration(seconds: float) -> str:
    """Go's time.Duration.String(): "0s", "1.5s", "1m30s", "1h0m0s", "250ms" (whole nanoseconds)."""
    ns = round(seconds * 1e9)
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:  # below a second Go switches to a smaller unit
        for unit, digits in (("ns", 0), ("µs", 3), ("ms", 6)):
            if ns < 10 ** (digits + 3):
                return sign + _fraction(ns, digits) + unit
    text = _fraction(ns % 60_000_000_000, 9) + "s"
    minutes = ns // 60_000_000_000
    if minutes:
        text = f"{minutes % 60}m{text}"
        if minutes >= 60:
            text = f"{minutes // 60}h{text}"
    return sign + text


def _fraction(value: int, digits: int) -> str:
    """`value` scaled down by 10**digits, with the trailing zeros of its fraction dropped."""
    whole, part = divmod(value, 10**digits)
    decimals = f"{part:0{digits}d}".rstrip("0") if digits else ""
    return f"{whole}.{decimals}" if decimals else str(whole)
