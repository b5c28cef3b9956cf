"""Where a streamed request's CPU goes in the daemon (issue 25 aim 1): short streams through the daemon on
the stand-in engine (bench/standin_engine.py, as bench/relay.py runs it), CPU per request from /proc (and
the kernel's share of it: system calls, the loopback sockets' work), and with `--py-spy` the daemon sampled
by py-spy meanwhile: the share of its busy samples by the line that was running (its own time; a C call
such as a socket write is charged to the line that made it) and by module.

    .venv/bin/python bench/request_profile.py [--tokens 2] [--concurrency 16] [--seconds 15]
        [--py-spy [--samples FILE]] [--baseline /tmp/before/src [--rounds 6]]

With `--baseline SRC` a second daemon runs that version (its `src` first on PYTHONPATH, its own stand-in
engine), and the two take turns: `--rounds` windows of `--seconds` each, CPU per request in each window,
the median per version and the ratio printed (no py-spy then): before and after in one run, on a machine
whose single runs move by 20 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.relay import cpu_seconds_since, cpu_times, drive, start_versions, use_standin_engine  # noqa: E402

from tests.daemon import Daemon  # noqa: E402

PATH = "/engines/v1/chat/completions"
# frames of threads that wait (the event loop's select, idle worker threads): not the daemon's work
IDLE = ("Runner.run", "_worker", "Condition.wait", "select")
AREAS = {
    "front (HTTP/1, request state)": "server/front.py",
    "engine connection, first chunk": "server/engine_pool.py",
    "request lifecycle": "server/lifecycle.py",
    "logs": ("eventlog.py", "logging/"),
    "store lookup": ("store/", "pathlib.py"),
    "C relay hand-off": "native_relay.py",
    "recorder": "recorder.py",
    "metrics": "prometheus_client",
    "scheduler": "scheduler/",
    "json": "json/",
}


def profile_shares(raw: Path) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """py-spy's raw (folded) samples: busy samples, the top lines by own share, and each area's share
    (a sample counts for an area when one of its last three frames is in it)."""
    own: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    busy = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, n = stack.split(";"), int(count)
        if frames[-1].startswith(IDLE) or "select" in frames[-1]:
            continue
        busy += n
        own[frames[-1]] += n
        last = frames[-3:]
        for area, keys in AREAS.items():
            if any(key in frame for frame in last for key in ((keys,) if isinstance(keys, str) else keys)):
                areas[area] += n
    top = [(line, n / busy) for line, n in own.most_common(12)]
    return busy, top, [(area, n / busy) for area, n in areas.most_common()]


def spy_program() -> str:
    return shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))


def user_system_ticks(pid: int) -> tuple[int, int]:
    """The process's user and system CPU time so far, in clock ticks (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]), int(fields[12])


def cpu_per_request(daemon: Daemon, body: bytes, args: argparse.Namespace) -> tuple[float, int, float]:
    """Streams through `daemon` for `args.seconds`: its CPU seconds per request, the requests, and the
    share of that CPU spent in the kernel (system time; from 10 ms ticks, so a rough share)."""
    assert daemon.process is not None
    pid = daemon.process.pid
    ticks = user_system_ticks(pid)
    before, started, requests = cpu_times([pid]), time.perf_counter(), 0
    while time.perf_counter() - started < args.seconds:
        batch = args.concurrency * 8
        asyncio.run(drive(daemon.port, PATH, body, args.concurrency, batch, args.tokens))
        requests += batch
    cpu = cpu_seconds_since(before, [pid])
    user, system = (after - then for after, then in zip(user_system_ticks(pid), ticks, strict=True))
    return cpu / requests, requests, system / max(1, user + system)


def compare(daemons: dict[str, Daemon], body: bytes, args: argparse.Namespace) -> None:
    runs: dict[str, list[float]] = {name: [] for name in daemons}
    for _ in range(args.rounds):
        for name, daemon in daemons.items():
            runs[name].append(cpu_per_request(daemon, body, args)[0] * 1e6)
    for name, values in runs.items():
        each = " ".join(f"{value:.0f}" for value in values)
        print(f"{name}: median {statistics.median(values):.0f} us per request ({each})")
    ratio = statistics.median(runs["daemon"]) / statistics.median(runs["before"])
    print(f"{args.tokens}-token streams at c={args.concurrency}: daemon / before {ratio:.2f}")


def profile(daemon: Daemon, work: Path, body: bytes, args: argparse.Namespace) -> None:
    spy = None
    if args.py_spy:
        assert daemon.process is not None
        command = [spy_program(), "record", "-r", "250", "-d", str(int(args.seconds)), "-f", "raw"]
        command += ["-o", str(work / "samples.txt"), "-p", str(daemon.process.pid)]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
    cpu, requests, system = cpu_per_request(daemon, body, args)
    print(
        f"{requests} requests of {args.tokens} tokens at c={args.concurrency}: "
        f"{cpu * 1e6:.0f} us of the daemon's CPU per request, {system:.0%} of it in the kernel"
    )
    if spy is not None:
        spy.wait()
        busy, top, areas = profile_shares(work / "samples.txt")
        if args.samples is not None:
            shutil.copyfile(work / "samples.txt", args.samples)
        print(f"py-spy: {busy} busy samples; own time by line:")
        for line, share in top:
            print(f"  {share:6.1%}  {line}")
        print("by area (one of the last three frames):")
        for area, share in areas:
            print(f"  {share:6.1%}  {area}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--py-spy", action="store_true", help="sample the daemon with py-spy meanwhile")
    parser.add_argument("--samples", type=Path, help="keep py-spy's raw (folded) samples in this file")
    parser.add_argument("--baseline", type=Path, help="the src folder of a version to compare with")
    parser.add_argument("--rounds", type=int, default=6, help="windows per version with --baseline")
    args = parser.parse_args()
    if args.py_spy and not Path(spy_program()).exists():
        raise SystemExit("py-spy is missing: scripts/setup --dev installs it")
    if args.py_spy and args.baseline is not None:
        raise SystemExit("--py-spy samples one daemon: leave out --baseline")

    work = Path(tempfile.mkdtemp(prefix="bench-request-profile-"))
    use_standin_engine(work, 2)
    doc = {"model": "bench", "messages": [{"role": "user", "content": "go"}], "stream": True}
    body = json.dumps({**doc, "max_tokens": args.tokens}).encode()
    daemons: dict[str, Daemon] = {}
    try:
        versions: dict[str, dict[str, str]] = {}  # name: its environment
        if args.baseline is not None:
            versions["before"] = {"PYTHONPATH": str(args.baseline.resolve())}
        versions["daemon"] = {}
        start_versions(work, versions, daemons, body, args.tokens)
        if args.baseline is not None:
            compare(daemons, body, args)
        else:
            profile(daemons["daemon"], work, body, args)
    finally:
        for daemon in daemons.values():
            daemon.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
