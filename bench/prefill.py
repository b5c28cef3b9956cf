"""Benchmark what a client sees during a long, silent prefill, and what the engine sees when it leaves
(issue 34: a silent prefill is never a silent stream, and a client that leaves is let go at once).

The daemon serves the scripted engine (tests/fake_engine.py) as llama.cpp, whose streams send their head,
then nothing for FAKE_FIRST_CHUNK_DELAY seconds (llama-server sends a stream's head as its prefill starts),
and which notes the moment it sees its connection closed during that silence (`prefill_cancelled`).

* Keep-alive gaps: one streamed request per API at once, with a prefill of `--prefill` seconds and the
  daemon's keep-alive interval as configured (MODEL_RUNNER_STREAM_KEEPALIVE, 10 s by default); the
  largest gap between two reads of the client (the request's sending counts as the first) until the
  engine's first data. With `--load`, the streams wait for the model's load first (their heads go out
  early, with pings, then the engine's head comes as its prefill starts: a seam between two pingers).
* Cancel latency: per API, streamed and whole, a client that closes its socket during the prefill; the
  time from its close to the engine seeing its connection closed.

    .venv/bin/python bench/prefill.py [--prefill 35] [--load 0] [--runs 3]

Prints the tables, writes JSON (bench/results/prefill.json). Aims: no gap over 15 s; every cancel < 1 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.fake_engine import FakeEngine  # noqa: E402
from tests.inprocess import InProcessDaemon  # noqa: E402
from tests.models import write_tiny_gguf  # noqa: E402

HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
ORIGIN = b"Origin: http://localhost:3000\r\n"  # the front hands such a request to the ASGI stack
# (name, path, body, extra header lines): every API family, on each relay that serves it
ROUTES: list[tuple[str, str, dict[str, Any], bytes]] = [
    ("openai chat (front)", "/v1/chat/completions", {"messages": HI}, b""),
    ("openai chat (asgi)", "/v1/chat/completions", {"messages": HI}, ORIGIN),
    ("openai chat + tools", "/v1/chat/completions", {"messages": HI, "tools": TOOLS}, b""),
    ("openai completions", "/v1/completions", {"prompt": "hi"}, b""),
    ("anthropic messages", "/anthropic/v1/messages", {"messages": HI, "max_tokens": 8}, b""),
    ("responses", "/v1/responses", {"input": "hi"}, b""),
    ("ollama chat", "/api/chat", {"messages": HI}, b""),
    ("ollama generate", "/api/generate", {"prompt": "hi"}, b""),
]


def raw_request(path: str, body: dict[str, Any], extra: bytes) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
    return head + extra + b"Content-Length: %d\r\n\r\n" % len(data) + data


def first_data_at(path: str, received: bytes) -> bool:
    """Whether the engine's first data is in what the client received (not only pings and the head)."""
    marks = [b'"content_block_delta"', b'"t0', b'"hi"', b"response.output_text.delta"]
    if path.startswith("/api/"):
        marks = [b'"content":"t', b'"content": "t', b'"response":"t', b'"response": "t']
    return any(mark in received for mark in marks)


def gaps(daemon: InProcessDaemon, name: str, path: str, body: dict[str, Any], extra: bytes) -> dict[str, Any]:
    """The client's reads of a stream until the engine's first data: the largest gap between two."""
    with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
        sent = time.monotonic()
        sock.sendall(raw_request(path, {"model": "tiny", "stream": True, **body}, extra))
        reads, received = [sent], b""
        while not first_data_at(path, received):
            data = sock.recv(65536)
            if not data:
                break
            reads.append(time.monotonic())
            received += data
    steps = [b - a for a, b in itertools.pairwise(reads)]
    return {"api": name, "reads": len(reads) - 1, "largest_gap_s": round(max(steps), 2) if steps else None}


def events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def cancel(daemon: InProcessDaemon, log: Path, path: str, body: dict[str, Any], extra: bytes) -> float:
    """Seconds from the client's close, during the prefill, to the engine seeing its connection closed."""
    seen = len([e for e in events(log) if e["event"] == "prefill_cancelled"])
    requests = len([e for e in events(log) if e["event"] == "request"])
    sock = socket.create_connection(("127.0.0.1", daemon.port))
    sock.sendall(raw_request(path, {"model": "tiny", **body}, extra))
    deadline = time.monotonic() + 30
    while len([e for e in events(log) if e["event"] == "request"]) <= requests:  # the prefill began
        assert time.monotonic() < deadline, "the engine got no request"
        time.sleep(0.01)
    time.sleep(0.5)
    sock.setblocking(False)
    try:  # what came (a head, pings) is read first: a socket closed with unread bytes resets, as no
        while sock.recv(65536):  # client that read its answer does
            pass
    except BlockingIOError:
        pass
    closed = time.time()
    sock.close()
    while True:
        found = [e for e in events(log) if e["event"] == "prefill_cancelled"][seen:]
        if found:
            return float(found[0]["at"]) - closed
        if time.monotonic() > deadline + 30:
            return float("inf")  # the engine never saw it within the prefill: it answered nobody
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefill", type=float, default=35.0, help="seconds before the first token")
    parser.add_argument("--load", type=float, default=0.0, help="seconds the model loads, as streams wait")
    parser.add_argument("--runs", type=int, default=3, help="cancels per API and kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        home, log = Path(folder) / "home", Path(folder) / "events.jsonl"
        os.environ["MODEL_RUNNER_HOME"] = str(home)
        env = {"FAKE_FIRST_CHUNK_DELAY": str(args.prefill), "FAKE_EVENTS": str(log), "FAKE_CHUNKS": "3"}
        env["FAKE_START_DELAY"] = str(args.load)
        daemon = InProcessDaemon(home, {"llama.cpp": FakeEngine(env=env)}).start()
        try:
            gguf = write_tiny_gguf(Path(folder) / "tiny.gguf")
            daemon.http("POST", "/models/package", json={"target": "tiny", "gguf": str(gguf)})
            if not args.load:  # else the streams wait for the load: early heads, then the engine's
                preload = {"X-Preload-Only": "true"}
                daemon.http("POST", "/engines/v1/chat/completions", headers=preload, json={"model": "tiny"})
            interval = os.environ.get("MODEL_RUNNER_STREAM_KEEPALIVE", "10 (default)")
            found: list[dict[str, Any]] = []
            threads = [
                threading.Thread(target=lambda r=route: found.append(gaps(daemon, *r))) for route in ROUTES
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            print(f"keep-alive gaps, load {args.load} s, prefill {args.prefill} s, interval {interval} s")
            print(f"{'API':<24} {'reads':>6} {'largest gap (s)':>16}")
            for row in sorted(found, key=lambda r: [n for n, *_ in ROUTES].index(r["api"])):
                print(f"{row['api']:<24} {row['reads']:>6} {row['largest_gap_s']!s:>16}")
            cancels: list[dict[str, Any]] = []
            for name, path, body, extra in ROUTES:
                for stream in (True, False):
                    asked = {**body, "stream": stream}
                    times = [cancel(daemon, log, path, asked, extra) for _ in range(args.runs)]
                    cancels.append({"api": name, "stream": stream, "seconds": [round(t, 3) for t in times]})
            print(f"\ncancel latency, client close -> engine sees its connection closed ({args.runs} runs)")
            print(f"{'API':<24} {'kind':<8} {'median (s)':>10} {'max (s)':>8}")
            for row in cancels:
                kind = "stream" if row["stream"] else "whole"
                median, most = statistics.median(row["seconds"]), max(row["seconds"])
                print(f"{row['api']:<24} {kind:<8} {median:>10.3f} {most:>8.3f}")
        finally:
            daemon.stop()
    out = ROOT / "bench" / "results" / "prefill.json"
    out.parent.mkdir(exist_ok=True)
    results = {"load_s": args.load, "prefill_s": args.prefill, "interval_s": interval}
    results |= {"gaps": found, "cancels": cancels}
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
