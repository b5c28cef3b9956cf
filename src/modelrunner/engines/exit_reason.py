"""How an engine process ended, in words a user can act on.

A bare "exited with code -4" says nothing to most users. A death by signal is named, with what it usually
means and what to do: SIGILL (instructions this CPU cannot run: reinstall the engine, whose build is then
proven on this CPU), SIGKILL (most often the kernel's out-of-memory killer: how much the model needs against
what is free), SIGSEGV / SIGABRT / SIGBUS / SIGFPE (a crash: where its log is). The engine's own last words
follow, its meaningful lines (errors, warnings) rather than the start-up banner it printed last.
"""

from __future__ import annotations

import contextlib
import re
import signal

_CRASHES = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE})
# llama.cpp's log level letter after its timestamp ("0.00.004.969 E ..."), Python's logging and tracebacks,
# and the words engines use when something went wrong.
_MEANINGFUL = re.compile(
    r"^\s*[\d.]+\s+[EW]\s|\b(ERROR|WARNING|CRITICAL|Traceback)\b|error|fatal|abort|assert|exception|failed"
    r"|out of memory|illegal|segmentation|killed|crash",
    re.IGNORECASE,
)
_INFO = re.compile(r"^\s*[\d.]+\s+I\s")  # llama.cpp's info level: its start-up banner, its progress
MAX_LINES = 3
MAX_CHARS = 600
GIB = 1 << 30


def signal_name(signum: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return f"signal {signum}"


def memory_available() -> int | None:
    """MemAvailable of /proc/meminfo, in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def last_words(output: str) -> str:
    """The engine's meaningful last lines: its errors and warnings, and the very last line it wrote (what it
    said as it died, in whatever words: an abort's message has no level) unless it is llama.cpp's info banner;
    else its last lines."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    meaningful = [i for i, line in enumerate(lines) if _MEANINGFUL.search(line)]
    last = len(lines) - 1
    if meaningful and meaningful[-1] != last and not _INFO.match(lines[last]):
        meaningful.append(last)
    chosen = [lines[i] for i in meaningful][-MAX_LINES:] if meaningful else lines[-MAX_LINES:]
    text = " | ".join(chosen)
    return text if len(text) <= MAX_CHARS else "..." + text[-MAX_CHARS:]


def describe_exit(
    returncode: int,
    *,
    engine: str,
    output: str = "",
    log_name: str | None = None,
    memory_needed: int | None = None,
) -> str:
    """One sentence on how the engine ended and what to do, then its last meaningful lines."""
    words = last_words(output)
    if returncode >= 0:
        return (
            f"engine exited with code {returncode}: {words}"
            if words
            else f"engine exited with code {returncode}"
        )
    else:
        signum = -returncode
        name = signal_name(signum)
        if signum == signal.SIGILL:
            how = (
                f"the engine died by {name}: it was built for instructions this CPU cannot run; "
                f"run: model reinstall-runner --backend {engine}"
            )
        elif signum == signal.SIGKILL:
            how = f"the engine was killed ({name}), most often by the kernel's out-of-memory killer"
            free = memory_available()
            if memory_needed and free is not None:
                how += f" (the model needs about {memory_needed / GIB:.1f} GiB; {free / GIB:.1f} GiB free)"
        elif signum in _CRASHES:
            where = f"its log {log_name} (`model logs`)" if log_name else "its log (`model logs`)"
            how = f"the engine crashed ({name}): see {where}"
        else:
            how = f"the engine was ended by {name}"
    return f"{how}. Its last lines: {words}" if words else how
