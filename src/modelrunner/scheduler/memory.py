"""How much memory the scheduler may fill with runners."""

from __future__ import annotations

import os
import re

from modelrunner.errors import BadRequest

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "tb": 10**12,
}


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise BadRequest(f"invalid size {text[:40]!r}: use e.g. 8GB, 512MiB or a number of bytes")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def env_bytes(name: str, default: int) -> int:
    """A size from the environment variable `name` (`64MiB`, `1GB`, a number of bytes), else `default`."""
    raw = os.environ.get(name, "").strip()
    try:
        return parse_bytes(raw) if raw else default
    except BadRequest as exc:
        raise ValueError(f"{name}: {exc.message}") from None


def meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_budget() -> int:
    """`MODEL_RUNNER_MEMORY_BUDGET` (e.g. "8GB"), else 90% of the memory available at start."""
    explicit = os.environ.get("MODEL_RUNNER_MEMORY_BUDGET")
    if explicit:
        return parse_bytes(explicit)
    available = meminfo("MemAvailable") or meminfo("MemTotal") or 8 * 10**9
    return int(available * 0.9)


def resident_bytes(pid: int) -> int | None:
    """Resident set of a process: what a loaded runner really uses, shown next to the estimate."""
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
