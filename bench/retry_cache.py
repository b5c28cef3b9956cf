"""A retry finds its cache (issue 34; scheduler/conversations.py): a client gives up on a streamed request
during its prefill (closes its socket LEAVE seconds in, as Claude Code and OpenCode do when their timeout
passes) and sends it again at once. Through the daemon the retry waits until llama-server has let the
abandoned one go, then lands on the slot holding the abandoned prefill; sent to the runner's own socket
(llama-server alone, the same process) it lands on another slot and prefills from zero. Per round, both,
alternating which goes first, each with a prompt of its own (~3,000 tokens of SmolLM2-135M Q4_1): the
retry's time to its answer (max_tokens 1) and its cached prompt tokens; the ratio direct / daemon.

    .venv/bin/python bench/retry_cache.py [--rounds 3] [--leave 4] [--lines 110] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.llama_servers import server_binary  # noqa: E402
from bench.proxy import runner_socket  # noqa: E402

from modelrunner.embedded import smollm2_gguf  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402

CHAT = "/v1/chat/completions"


def prompt(tag: str, lines: int) -> str:
    code = "\n".join(f"def step_{i}(x):  # step {i}\n    return x * {i} + {i % 7}" for i in range(lines))
    return f"{tag}\n{code}\nSummarise."


def give_up(connect: Any, path: str, body: dict[str, Any], leave: float) -> None:
    raw = json.dumps({**body, "stream": True}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with connect() as client:
        client.sendall(f"{head}Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        time.sleep(leave)


def retry(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, float]:
    started = time.monotonic()
    answer = client.post(path, json=body, timeout=900)
    answer.raise_for_status()
    usage = answer.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"seconds": time.monotonic() - started, "cached": cached, "prompt": usage["prompt_tokens"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--leave", type=float, default=4.0)
    parser.add_argument("--lines", type=int, default=110)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ["LLAMA_SERVER_PATH"] = str(server_binary())
    results: dict[str, list[dict[str, float]]] = {"daemon": [], "direct": []}
    with tempfile.TemporaryDirectory() as work:
        daemon = Daemon(Path(work) / "home", free_port()).start()
        try:
            daemon.cli("package", "--gguf", str(smollm2_gguf()), "smol")
            first = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            daemon.http("POST", "/engines" + CHAT, json=first).raise_for_status()
            sock = runner_socket(daemon)
            ways = {
                "daemon": (
                    httpx.Client(base_url=daemon.url + "/engines"),
                    lambda: socket.create_connection(("127.0.0.1", daemon.port)),
                ),
                "direct": (
                    httpx.Client(base_url="http://engine", transport=httpx.HTTPTransport(uds=str(sock))),
                    lambda: _unix(sock),
                ),
            }
            for round_ in range(args.rounds):
                order = ["daemon", "direct"] if round_ % 2 == 0 else ["direct", "daemon"]
                for way in order:
                    client, connect = ways[way]
                    text = prompt(f"{way} round {round_}", args.lines)
                    body = {"model": "smol", "messages": [{"role": "user", "content": text}], "max_tokens": 1}
                    give_up(connect, CHAT, body, args.leave)
                    result = retry(client, CHAT, {**body, "temperature": 0})
                    results[way].append(result)
                    print(
                        f"round {round_} {way:6}: retry {result['seconds']:6.1f} s, cached "
                        f"{result['cached']:5.0f} of {result['prompt']:5.0f} prompt tokens",
                        flush=True,
                    )
        finally:
            daemon.stop()
    summary = {
        way: {
            "retry_s_median": statistics.median(r["seconds"] for r in runs),
            "cached_share_median": statistics.median(r["cached"] / r["prompt"] for r in runs),
        }
        for way, runs in results.items()
    }
    ratio = summary["direct"]["retry_s_median"] / summary["daemon"]["retry_s_median"]
    print(json.dumps(summary, indent=1))
    print(f"retry time, llama-server alone / through the daemon: {ratio:.2f}x")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"out": str(args.out)},
                    "runs": results,
                    "summary": summary,
                    "ratio": ratio,
                },
                indent=1,
            )
        )


def _unix(path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(path))
    return client


if __name__ == "__main__":
    main()
