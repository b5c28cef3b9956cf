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


def human_duration(seconds: float) -> str:
    """Docker's HumanDuration: "About a minute", "3 hours", "2 weeks"."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = s // 60
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(s / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    days = s // 86400
    if days < 14:
        return f"{days} days"
    if days < 60:
        return f"{days // 7} weeks"
    if days < 365 * 2:
        return f"{days // 30} months"
    return f"{days // 365} years"


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
