"""Plain-text rendering for the CLI: aligned tables (like Go's tabwriter), sizes and relative times."""

from __future__ import annotations

import time
from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in [headers, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("   ".join(cells).rstrip())
    return "\n".join(lines)


_SECOND_NS = 1_000_000_000
_MINUTE_NS = 60 * _SECOND_NS
_HOUR_NS = 60 * _MINUTE_NS


def _go_units(duration_ns: int, unit_ns: int) -> float:
    """time.Duration.Seconds/Minutes/Hours: whole units plus the remainder as a fraction, with Go's
    division (truncated toward zero)."""
    whole = abs(duration_ns) // unit_ns * (1 if duration_ns >= 0 else -1)
    rest = duration_ns - whole * unit_ns
    return float(whole) + float(rest) / unit_ns


def human_duration(seconds: float) -> str:
    """docker/go-units' HumanDuration (duration.go), as DMR's `ls` and `ps` print ages: "About a minute",
    "3 hours" (hours rounded half up), then days, weeks and months counted from those rounded hours, and
    years from the whole hours."""
    duration = round(seconds * _SECOND_NS)  # a time.Duration
    whole_seconds = int(_go_units(duration, _SECOND_NS))
    if whole_seconds < 1:
        return "Less than a second"
    if whole_seconds == 1:
        return "1 second"
    if whole_seconds < 60:
        return f"{whole_seconds} seconds"
    minutes = int(_go_units(duration, _MINUTE_NS))
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = int(_go_units(duration, _HOUR_NS) + 0.5)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{int(_go_units(duration, _HOUR_NS)) // 24 // 365} years"


def ago(unix: int, now: float | None = None) -> str:
    if unix <= 0:
        return ""
    return human_duration((now or time.time()) - unix) + " ago"


def decimal_size(n_bytes: int) -> str:
    """Decimal units as docker's HumanSize: "253.1MB", "4.92GB"."""
    value = float(n_bytes)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.4g}{unit}"
        value /= 1000
    return f"{value:.4g}TB"
