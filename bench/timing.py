"""Wall time and CPU time of benchmark runs, and their table, for bench/pull.py and bench/package.py; the
wall time of one command (bench/cli.py, bench/growth.py).

CPU seconds are the ones that another job on a shared machine cannot move much (wall times are its share
of the cores): user + system time of the commands this process ran and waited for, plus a long-running
process's (the daemon's, from /proc, in clock ticks of 10 ms). Kernel threads (the writeback) count nowhere.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def cpu_seconds(pid: int | None = None) -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = usage.ru_utime + usage.ru_stime
    if pid is not None:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def timed(run: Callable[[], object], pid: int | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `run()`, after a sync so that no earlier writeback lands in it."""
    os.sync()
    cpu = cpu_seconds(pid)
    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    return wall, cpu_seconds(pid) - cpu


def command_seconds(command: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one command, its output dropped."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def table_rows(times: dict[str, list[float]], cpu: dict[str, list[float]], size: int) -> list[str]:
    """Markdown rows: median wall time, throughput, median CPU seconds, and every run's wall time."""
    rows = [
        f"| {'':16} | {'median s':>8} | {'MB/s':>5} | {'CPU s':>5} | {'runs, s':<20} |",
        f"|{'-' * 18}|{'-' * 10}|{'-' * 7}|{'-' * 7}|{'-' * 22}|",
    ]
    for name, values in times.items():
        wall, used = statistics.median(values), statistics.median(cpu[name])
        runs_text = " ".join(f"{t:.2f}" for t in values)
        rows.append(
            f"| {name:16} | {wall:>8.2f} | {size / wall / 1e6:>5.0f} | {used:>5.2f} | {runs_text:<20} |"
        )
    return rows
