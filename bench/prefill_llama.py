"""The cancel of an abandoned prefill on a real llama-server (bench/prefill.py measures it on the scripted
engine): per API, streamed and whole, a client asks with a long prompt (3,000 words: ~18k tokens of the
tiny F32 model, one slot, ~25 s of prefill on 2 cores), closes its socket 1 s into the prefill (having read
what came), and the engine's own log says when the task stopped and how many prompt tokens it had
processed. Read from the log: polling /slots would keep llama-server's result queue busy, and its HTTP
thread looks at its client only after an idle second (server-queue.cpp).

    LLAMA_SERVER_PATH=.../llama-server .venv/bin/python bench/prefill_llama.py [WORDS]
"""

from __future__ import annotations

import json
import re
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import write_tiny_gguf  # noqa: E402

PATHS = ["/v1/chat/completions", "/api/chat", "/anthropic/v1/messages", "/v1/responses"]
STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")  # llama.cpp's log: minutes.seconds.ms.us since start


def stamp(line: str) -> float:
    found = STAMP.match(line)
    assert found is not None, line
    minutes, seconds, ms, us = (int(part) for part in found.groups())
    return minutes * 60 + seconds + ms / 1e3 + us / 1e6


def lines(log: Path, text: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if text in line]


def leave_during_prefill(daemon: Daemon, log: Path, path: str, words: str, stream: bool) -> str:
    body = {"input": words} if path == "/v1/responses" else {"messages": [{"role": "user", "content": words}]}
    data = json.dumps({"model": "long", "stream": stream, "max_tokens": 50, **body}).encode()
    launched = len(lines(log, "launch_slot_"))
    with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall(head.encode() + b"Content-Length: %d\r\n\r\n" % len(data) + data)
        while len(lines(log, "launch_slot_")) <= launched:
            time.sleep(0.002)
        seen = time.monotonic()
        launch = lines(log, "launch_slot_")[-1]
        task = re.search(r"task (\d+)", launch)
        assert task is not None
        time.sleep(1.0)
        sock.setblocking(False)
        try:  # read what came: a socket closed with unread bytes is reset, not closed
            while sock.recv(65536):
                pass
        except BlockingIOError:
            pass
        closed_after = time.monotonic() - seen
    while not (stopped := lines(log, f"task {task[1]} | stop processing")):
        time.sleep(0.01)
    processed = re.search(r"n_tokens = (\d+)", stopped[0])
    seconds = stamp(stopped[0]) - stamp(launch) - closed_after
    kind = "stream" if stream else "whole"
    return f"{path:<24} {kind:<7} {seconds:>6.2f} {processed[1] if processed else '?':>10}"


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    folder = Path(tempfile.mkdtemp())
    daemon = Daemon(folder / "home", free_port()).start()
    try:
        gguf = write_tiny_gguf(folder / "long.gguf", context_length=32768)
        daemon.cli("package", "--gguf", str(gguf), "long")
        daemon.cli("configure", "long", "--", "--parallel", "1", "--ctx-size", "32768")
        preload = {"X-Preload-Only": "true"}
        daemon.http("POST", "/engines/v1/chat/completions", headers=preload, json={"model": "long"})
        log = next((folder / "home" / "logs").glob("engine-llama.cpp-*"))
        print(f"{'API':<24} {'kind':<7} {'stop (s)':>6} {'prompt tokens done':>10}")
        case = 0
        for path in PATHS:
            for stream in (True, False):
                case += 1  # a prompt of its own: none is served from the slot's cache
                words = " ".join(f"c{case}w{i}" for i in range(count))
                print(leave_during_prefill(daemon, log, path, words, stream), flush=True)
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
