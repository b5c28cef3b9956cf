"""How soon llama-server stops prefilling a prompt whose client has left, per batch size (issue 34's aim:
the engine's task cancelled within 1 s of the client closing its connection).

A streamed /v1/chat/completions with the 12k-token agent prompt of bench/prefill_options.py (SmolLM2-135M,
a new nonce each run), straight to llama-server: the client closes its socket N seconds after the slot
started the task (having read what came: a socket closed with unread bytes is reset, not closed). Two
clocks say when the engine stopped: its own log (`--log-timestamps -lv 4`: the task's `stop processing`
line, and how many prompt tokens it had done), and its CPU time (/proc/PID/stat, sampled every 20 ms: the
last sample that grew before 1 s without growth). /slots is not polled: each poll is a result that keeps
the HTTP thread from looking at its client (bench/prefill_llama.py). The configurations alternate.

llama-server notices a closed client within ~1 s while no result comes (its HTTP thread), and the slot
takes the cancel between two batches of `-b` tokens: the latency is about the rest of the batch in hand.

    .venv/bin/python bench/cancel_latency.py [--close-after 3,30] [--repeats 2,1]
        [--out bench/results/cancel_latency.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.llama_servers import Server, agent_messages, servers, smollm2
from bench.prefill_llama import stamp  # llama.cpp's log times

CONTEXT, TRAINED, TOKENS = 16384, 8192, 12000
LOG = ["--log-timestamps", "-lv", "4"]
CONFIGS: dict[str, list[str]] = {
    "b2048-ub512 (baseline)": [*LOG],
    "b1024-ub512": [*LOG, "-b", "1024"],
    "b512-ub512": [*LOG, "-b", "512", "-ub", "512"],
    "b256-ub256": [*LOG, "-b", "256", "-ub", "256"],
    "b1024-ub1024": [*LOG, "-b", "1024", "-ub", "1024"],
    "b2048-ub2048": [*LOG, "-ub", "2048"],
}


class LogTail:
    """The lines llama-server appends to its log, read as they come."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.file.seek(0, 2)
        self.partial = ""

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> tuple[re.Match[str], str, float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = self.file.read()
            if chunk:
                text = self.partial + chunk
                lines = text.split("\n")
                self.partial = lines.pop()
                for line in lines:
                    if found := pattern.search(line):
                        return found, line, time.monotonic()
            else:
                time.sleep(0.002)
        raise TimeoutError(pattern.pattern)


def leave(server: Server, messages: list[dict[str, str]], close_after: float) -> dict[str, Any]:
    tail = LogTail(server.log)
    body = {"messages": messages, "stream": True, "max_tokens": 8, "temperature": 0, "cache_prompt": False}
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall(head.encode() + b"Content-Length: %d\r\n\r\n" % len(data) + data)
        found, launch, seen = tail.wait_for(re.compile(r"task (\d+) \| processing task"), 300)
        time.sleep(close_after)
        sock.setblocking(False)
        try:  # read what came: a socket closed with unread bytes is reset, not closed
            while sock.recv(65536):
                pass
        except BlockingIOError:
            pass
    closed = time.monotonic()
    cpu_before, last_growth, cpu_stop = server.cpu_seconds(), closed, None
    stop_pattern = re.compile(rf"task {found[1]} \| stop processing: n_tokens = (\d+)")
    stopped: tuple[re.Match[str], str, float] | None = None
    while time.monotonic() - last_growth < 1.0 or stopped is None:
        time.sleep(0.02)
        cpu = server.cpu_seconds()
        if cpu > cpu_before:
            cpu_before, last_growth = cpu, time.monotonic()
        if stopped is None:
            with contextlib.suppress(TimeoutError):
                stopped = tail.wait_for(stop_pattern, 0.001)
        if time.monotonic() - closed > 300:
            raise TimeoutError("the engine did not stop within 300 s")
    cpu_stop = last_growth - closed
    by_log = stamp(stopped[1]) - stamp(launch) - (closed - seen)
    tail.file.close()
    return {
        "close_after_s": close_after,
        "stop_by_log_s": round(by_log, 3),
        "stop_by_cpu_s": round(cpu_stop, 3),
        "prompt_tokens_done": int(stopped[0][1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--close-after", default="3,30")
    parser.add_argument("--repeats", default="2,1")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=Path("bench/results/cancel_latency.json"))
    args = parser.parse_args()
    names = args.configs.split(",")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    work = Path(tempfile.mkdtemp(prefix="cancel-latency-"))
    started = time.monotonic()
    plan = zip(
        (float(x) for x in args.close_after.split(",")),
        (int(x) for x in args.repeats.split(",")),
        strict=True,
    )
    with servers({n: CONFIGS[n] for n in names}, smollm2(), CONTEXT, TRAINED, work) as running:
        for close_after, repeats in plan:
            for round_ in range(repeats):
                order = names if round_ % 2 == 0 else list(reversed(names))
                for name in order:
                    messages = agent_messages(running[name], TOKENS, f"cancel-{time.time_ns()}")
                    got = leave(running[name], messages, close_after)
                    results.setdefault(name, {}).setdefault(str(close_after), []).append(got)
                    print(
                        f"{name:<24} close {close_after:>4.0f} s: stop {got['stop_by_log_s']:>6.2f} s (log)"
                        f" {got['stop_by_cpu_s']:>6.2f} s (CPU), {got['prompt_tokens_done']} tokens done",
                        flush=True,
                    )
                    time.sleep(1.5)  # the cancelled slot saved to the prompt cache: not in the next run
    closes = list(next(iter(results.values())))
    print("\n| batch | " + " | ".join(f"close at {c} s: stop after (log / CPU), s" for c in closes) + " |")
    print("|---|" + "---|" * len(closes))
    summary: dict[str, Any] = {}
    for name, by_close in results.items():
        cells = []
        for close in closes:
            runs = by_close[close]
            log_s = statistics.median(r["stop_by_log_s"] for r in runs)
            cpu_s = statistics.median(r["stop_by_cpu_s"] for r in runs)
            summary.setdefault(name, {})[close] = {"log_s": log_s, "cpu_s": cpu_s}
            every = ", ".join(f"{r['stop_by_log_s']:.2f}" for r in runs)
            cells.append(f"{log_s:.2f} / {cpu_s:.2f} ({every})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"configs": {n: CONFIGS[n] for n in names}, "summary": summary, "runs": results}
    out |= {"seconds": round(time.monotonic() - started), "load_average_at_end": os.getloadavg()}
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
