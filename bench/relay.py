"""Benchmark the relay's ceiling: CPU time per relayed chunk, the daemon against nginx, in one run.

A stand-in engine (bench/standin_engine.py) plays a GPU server: one token per stream per batch step (step
time a parameter), so every read a relay makes holds one event and its cost per chunk sets the ceiling.
The daemon starts it as its `llama-server` (LLAMA_SERVER_PATH); nginx (Debian's package: one worker,
`proxy_pass` to the same Unix socket with kept-alive upstream connections, `proxy_buffering off`) relays to
the same process. At each concurrency both are driven alternately by the same client (kept-alive
connections, streamed chat), which checks that every chunk arrives, in order.

Reported per level and path: chunks per second, and CPU microseconds per relayed chunk (user + system time
of the relaying processes from /proc: the daemon's own process, not its engine child; nginx's master and
worker), and their ratio daemon / nginx.

    .venv/bin/python bench/relay.py [--levels 1,16,64,256] [--step-ms 2] [--tokens 200] [--rounds 2]
        [--baseline /tmp/before/src]

With `--baseline SRC` a second daemon runs that version (its `src` first on PYTHONPATH, its own stand-in
engine) and is measured alongside: before, now and nginx in one run. `--python-relay` does the same with
this version and MODEL_RUNNER_NATIVE_RELAY=0 (every chunk relayed in Python, no C relay).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelrunner.http1 import Answer  # noqa: E402
from modelrunner.response_reader import MAX_HEAD  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import write_tiny_gguf  # noqa: E402

NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx-body;
    proxy_temp_path {work}/nginx-proxy;
    fastcgi_temp_path {work}/nginx-fastcgi;
    uwsgi_temp_path {work}/nginx-uwsgi;
    scgi_temp_path {work}/nginx-scgi;
    upstream engine {{ server unix:{socket}; {keepalive} }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 100000;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""
_INDEX = re.compile(rb'"content":"(\d+) "')


def use_standin_engine(work: Path, step_ms: float) -> None:
    """Daemons started from now on run the stand-in engine as their `llama-server` (a wrapper in `work`),
    one token per stream every `step_ms` (bench/growth.py and bench/request_profile.py use it too)."""
    wrapper = work / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {ROOT / "bench" / "standin_engine.py"} "$@"\n')
    wrapper.chmod(0o755)
    os.environ.update(LLAMA_SERVER_PATH=str(wrapper), STANDIN_STEP_MS=str(step_ms))


def add_bench_model(daemon: Daemon, work: Path) -> None:
    """The tiny GGUF packaged in `daemon` as `bench`, kept loaded once it is (keep-alive -1)."""
    daemon.cli("package", "--gguf", str(write_tiny_gguf(work / "tiny.gguf")), "bench")
    daemon.cli("configure", "bench", "--keep-alive", "-1")


def cpu_times(pids: list[int]) -> dict[str, int]:
    """CPU time so far of each thread of the processes, in nanoseconds: the scheduler's own count
    (/proc/PID/task/TID/schedstat), not /proc/PID/stat's 10 ms ticks."""
    times = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that just ended
                times[f"{pid}/{task.name}"] = int((task / "schedstat").read_text().split()[0])
    return times


def cpu_seconds_since(before: dict[str, int], pids: list[int]) -> float:
    """CPU time of the processes' threads since `before` (a thread that ended meanwhile, such as an idle
    worker thread, is left out: counting per process would subtract its whole life)."""
    after = cpu_times(pids)
    return sum(ns - before.get(tid, 0) for tid, ns in after.items()) / 1e9


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def drive(port: int, path: str, body: bytes, concurrency: int, requests: int, tokens: int) -> int:
    """`requests` streamed chats over `concurrency` kept-alive connections; returns the chunks received
    after checking each stream holds tokens 0..tokens-1 in order."""
    left = [requests]
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()

    async def worker() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=MAX_HEAD)
        received = 0
        try:
            while left[0] > 0:
                left[0] -= 1
                writer.write(head + body)
                answer = Answer(reader)
                status = (await answer.read_head()).status
                if status != 200:
                    raise RuntimeError(f"{path}: status {status}")
                expected = 0
                pending = b""  # an event cut between pieces (a relay may re-chunk the body anywhere)
                async for piece in answer.chunks():
                    events = (pending + piece).split(b"\n\n")
                    pending = events.pop()
                    for event in events:
                        for match in _INDEX.finditer(event):
                            if int(match.group(1)) != expected:
                                token = match.group(1).decode()
                                raise RuntimeError(f"{path}: token {token} where {expected}")
                            expected += 1
                if pending.strip():
                    raise RuntimeError(f"{path}: the stream ends in the middle of an event")
                if expected != tokens:
                    raise RuntimeError(f"{path}: {expected} tokens of {tokens}")
                received += expected
        finally:
            writer.close()
        return received

    return sum(await asyncio.gather(*(worker() for _ in range(concurrency))))


def measure(
    port: int, path: str, pids: list[int], body: bytes, concurrency: int, tokens: int
) -> dict[str, float]:
    requests = max(16, 2 * concurrency)
    before = cpu_times(pids)
    started = time.perf_counter()
    chunks = asyncio.run(drive(port, path, body, concurrency, requests, tokens))
    seconds = time.perf_counter() - started
    cpu = cpu_seconds_since(before, pids)
    return {"chunks": chunks, "seconds": seconds, "cpu_s": cpu}


VERSION_VARIABLES = ("PYTHONPATH", "MODEL_RUNNER_NATIVE_RELAY")  # what a version's environment may set


def start_versions(
    work: Path, versions: dict[str, dict[str, str]], daemons: dict[str, Daemon], body: bytes, tokens: int
) -> None:
    """A daemon for each version (name: its environment), each with a stand-in engine of its own (announced
    at work/socket-<name>), the bench model added and loaded with `body`. Each goes into `daemons` once
    started, for the caller to stop."""
    for name, environment in versions.items():
        os.environ["STANDIN_ANNOUNCE"] = str(work / f"socket-{name}")
        for key in VERSION_VARIABLES:
            os.environ.pop(key, None)
        os.environ.update(environment)
        daemon = daemons[name] = Daemon(work / name, free_port()).start()
        add_bench_model(daemon, work)
        asyncio.run(drive(daemon.port, "/engines/v1/chat/completions", body, 1, 1, tokens))
    for key in VERSION_VARIABLES:
        os.environ.pop(key, None)


def start_nginx(work: Path, socket: str, keep_alive: bool = True) -> tuple[subprocess.Popen[bytes], int]:
    """nginx on a free port of 127.0.0.1 in front of the engine's socket; with `keep_alive` its connections
    to the engine are kept between requests (not for llama-server, which closes a stream's connection: a
    POST nginx sends on such a connection fails with a 502, since nginx re-sends no POST)."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        raise SystemExit("nginx is missing: apt-get install nginx (Debian's package is the reference)")
    port = free_port()
    conf = work / "nginx.conf"
    # as root, nginx's worker would run as nobody, who may not open the daemon's runner folder
    user = "user root;" if os.geteuid() == 0 else ""
    keepalive = "keepalive 512;" if keep_alive else ""
    conf.write_text(NGINX_CONF.format(user=user, work=work, socket=socket, port=port, keepalive=keepalive))
    process = subprocess.Popen([nginx, "-c", str(conf), "-e", str(work / "nginx-error.log")])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with __import__("socket").create_connection(("127.0.0.1", port), timeout=1):
                return process, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("nginx did not start; see " + str(work / "nginx-error.log"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", default="1,16,64,256")
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "relay.json")
    parser.add_argument("--baseline", type=Path, help="the src folder of a version to compare with")
    parser.add_argument(
        "--python-relay",
        action="store_true",
        help="measure this version with MODEL_RUNNER_NATIVE_RELAY=0 (every chunk relayed in Python) as well",
    )
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]

    work = Path(tempfile.mkdtemp(prefix="bench-relay-"))
    use_standin_engine(work, args.step_ms)
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "go"}],
            "stream": True,
            "max_tokens": args.tokens,
        }
    ).encode()
    daemons: dict[str, Daemon] = {}
    nginx: subprocess.Popen[bytes] | None = None
    try:
        versions: dict[str, dict[str, str]] = {}  # name: its environment
        if args.baseline is not None:
            versions["before"] = {"PYTHONPATH": str(args.baseline.resolve())}
        if args.python_relay:
            versions["python"] = {"MODEL_RUNNER_NATIVE_RELAY": "0"}
        versions["daemon"] = {}
        start_versions(work, versions, daemons, body, args.tokens)  # the last one's engine serves nginx too
        nginx, nginx_port = start_nginx(work, (work / "socket-daemon").read_text())
        paths = {"nginx": (nginx_port, "/v1/chat/completions", [nginx.pid, *children(nginx.pid)])}
        for name, daemon in daemons.items():
            assert daemon.process is not None
            paths[name] = (daemon.port, "/engines/v1/chat/completions", [daemon.process.pid])
        results: dict[str, Any] = {"step_ms": args.step_ms, "tokens": args.tokens, "levels": {}}
        for concurrency in levels:
            totals = {name: {"chunks": 0, "seconds": 0.0, "cpu_s": 0.0} for name in paths}
            for _ in range(args.rounds):
                for name, (port, path, pids) in paths.items():
                    run = measure(port, path, pids, body, concurrency, args.tokens)
                    for key in run:
                        totals[name][key] += run[key]
            row: dict[str, Any] = {}
            for name, total in totals.items():
                row[name] = {
                    "chunks_per_s": total["chunks"] / total["seconds"],
                    "cpu_us_per_chunk": total["cpu_s"] / total["chunks"] * 1e6,
                    "chunks": total["chunks"],
                }
            nginx_us = row["nginx"]["cpu_us_per_chunk"]
            row["cpu_ratio"] = row["daemon"]["cpu_us_per_chunk"] / nginx_us
            ratios = f"ratio {row['cpu_ratio']:.2f}"
            for other in ("before", "python"):
                if other in row:
                    row[f"{other}_cpu_ratio"] = row[other]["cpu_us_per_chunk"] / nginx_us
                    ratios += f" {other} {row[f'{other}_cpu_ratio']:.2f}"
            results["levels"][concurrency] = row
            cells = [
                f"{name} {r['chunks_per_s']:>6.0f}/s {r['cpu_us_per_chunk']:>6.2f} us"
                for name, r in ((name, row[name]) for name in paths)
            ]
            print(f"c={concurrency:<4} " + " | ".join(cells) + " | " + ratios, flush=True)
    finally:
        if nginx is not None:
            nginx.terminate()
            nginx.wait(10)
        for daemon in daemons.values():
            daemon.stop()
        shutil.rmtree(work, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
