"""Micro-benchmark: CPU time per chunk of the Messages relay (server/anthropic_serving.py `relay_events`).

The engine's native `/v1/messages` stream is relayed chunk by chunk; a stream with a thinking block is
parsed from that block on to sign it (compat/thinking_signature.py), one without passes untouched. This
feeds `relay_events` llama-server b11434's events (one per chunk, as a GPU server sends them: one token per
read), from memory, and reports the CPU microseconds per chunk: a stream of text only, and one whose first
half is a thinking block. No engine, no socket: the relay's own cost.

    .venv/bin/python bench/anthropic_relay.py [--chunks 20000] [--rounds 5] [--baseline /tmp/before/src]

With `--baseline SRC` the same is measured on that version too (a subprocess with its `src` first on
PYTHONPATH), alternating rounds, before and now in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _event(doc: dict[str, Any]) -> bytes:
    """As llama-server writes one (format_anthropic_sse: compact JSON)."""
    data = json.dumps(doc, separators=(",", ":"))
    return f"event: {doc['type']}\ndata: {data}\n\n".encode()


def stream(chunks: int, thinking: bool) -> list[bytes]:
    start = {"type": "message_start", "message": {"id": "chatcmpl-1", "content": [], "role": "assistant"}}
    out = [_event(start)]
    text_index, tokens = 0, chunks - 3
    if thinking:
        out.append(_event({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}}))
        for i in range(tokens // 2):
            delta = {"type": "thinking_delta", "thinking": f" thought{i}"}
            out.append(_event({"type": "content_block_delta", "index": 0, "delta": delta}))
        text_index, tokens = 1, tokens - tokens // 2
    out.append(
        _event({"type": "content_block_start", "index": text_index, "content_block": {"type": "text"}})
    )
    for i in range(tokens):
        delta = {"type": "text_delta", "text": f" word{i}"}
        out.append(_event({"type": "content_block_delta", "index": text_index, "delta": delta}))
    end = [{"type": "signature_delta", "signature": ""}] if thinking else []
    closing = [{"type": "content_block_delta", "index": 0, "delta": d} for d in end]
    closing += [{"type": "content_block_stop", "index": i} for i in range(text_index + 1)]
    closing += [{"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, {"type": "message_stop"}]
    out.append(b"".join(_event(d) for d in closing))
    return out


class _Call:
    """What relay_events reads of an EngineCall: the chunks, `close()`."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk

    async def close(self) -> None:
        return None


async def _relay(chunks: list[bytes]) -> int:
    from modelrunner.server.anthropic_serving import relay_events

    size = 0
    async for out in relay_events(_Call(chunks), None):  # type: ignore[arg-type]  # opens with message_start
        size += len(out)
    return size


def measure(chunks: int) -> dict[str, float]:
    """CPU microseconds per chunk of one relay of each stream, in this process."""
    out = {}
    for name, thinking in (("text", False), ("thinking", True)):
        data = stream(chunks, thinking)
        asyncio.run(_relay(data[:50]))  # imports, warm-up
        cpu = time.process_time()
        asyncio.run(_relay(data))
        out[name] = (time.process_time() - cpu) / len(data) * 1e6
    return out


def _run(src: Path, chunks: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = [sys.executable, __file__, "--chunks", str(chunks), "--once"]
    return json.loads(subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="the `src` folder of the version to compare with")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        print(json.dumps(measure(args.chunks)))
        return
    versions = {"now": ROOT / "src"} | ({"before": args.baseline} if args.baseline else {})
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
    for _ in range(args.rounds):
        for name, src in versions.items():
            runs[name].append(_run(src, args.chunks))
    print(f"CPU us per chunk, median of {args.rounds} rounds of {args.chunks} chunks:")
    print(f"| version | {'text only':>9} | {'thinking':>9} |")
    for name, results in runs.items():
        text = statistics.median(r["text"] for r in results)
        thinking = statistics.median(r["thinking"] for r in results)
        print(f"| {name:7} | {text:9.2f} | {thinking:9.2f} |")


if __name__ == "__main__":
    main()
