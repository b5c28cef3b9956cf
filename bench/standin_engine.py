"""A stand-in for llama-server for the relay benchmark (bench/relay.py): a GPU-like engine that emits one
token per stream per batch step, so every read the relay makes holds one event.

Started by the daemon as its `llama-server` (LLAMA_SERVER_PATH points at a wrapper that runs this file):
it answers `--version`, serves `/health` and `POST /v1/chat/completions` on the Unix socket given by
`--host`, and streams `max_tokens` OpenAI chunks (content `"<n> "`, n = 0, 1, ...) per request, one per
stream every STANDIN_STEP_MS (default 2) milliseconds, from one clock for all streams, as a batch engine
does. STANDIN_ANNOUNCE names a file it writes its socket path to, so the benchmark can point nginx at the
same socket.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

VERSION = "version: 0.0.0-standin (build 11434, commit standin)"


class Batch:
    """The streams in progress; one step sends one chunk to each of them."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.streams: list[list[Any]] = []  # [writer, tokens left, next index, created, done future]
        self.wake = asyncio.Event()

    async def run(self) -> None:
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
            started = time.monotonic()
            done = []
            for stream in self.streams:
                writer, left, index, created, finished = stream
                if writer.is_closing():
                    done.append(stream)
                    continue
                if left == 0:
                    writer.write(_chunk(_final(created)) + _chunk(b"[DONE]") + b"0\r\n\r\n")
                    done.append(stream)
                    finished.set_result(None)
                    continue
                writer.write(_chunk(_token(index, created)))
                stream[1], stream[2] = left - 1, index + 1
            for stream in done:
                self.streams.remove(stream)
                if not stream[4].done():
                    stream[4].cancel()
            await asyncio.sleep(max(0.0, self.step - (time.monotonic() - started)))


def _chunk(payload: bytes) -> bytes:
    event = b"data: " + payload + b"\n\n"
    return f"{len(event):x}\r\n".encode() + event + b"\r\n"


def _token(index: int, created: int) -> bytes:
    return (
        b'{"id":"chatcmpl-standin","object":"chat.completion.chunk","created":%d,"model":"standin",'
        b'"choices":[{"index":0,"delta":{"content":"%d "},"finish_reason":null}]}' % (created, index)
    )


def _final(created: int) -> bytes:
    return (
        b'{"id":"chatcmpl-standin","object":"chat.completion.chunk","created":%d,"model":"standin",'
        b'"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}' % created
    )


async def handle(batch: Batch, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
            length = int({k.lower(): v for k, v in headers.items()}.get("content-length", "0"))
            body = await reader.readexactly(length) if length else b""
            if method == "GET" and path == "/health":
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n"
                )
                writer.write(b'{"status":"ok"}')
                continue
            if method != "POST" or not path.endswith("/chat/completions"):
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                continue
            tokens = int(json.loads(body).get("max_tokens") or 16)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            finished = asyncio.get_running_loop().create_future()
            batch.streams.append([writer, tokens, 0, int(time.time()), finished])
            batch.wake.set()
            await finished  # then the next request on this kept-alive connection
    except (asyncio.IncompleteReadError, asyncio.CancelledError, ConnectionError, ValueError):
        pass
    writer.close()


async def main(socket: str) -> None:
    batch = Batch(float(os.environ.get("STANDIN_STEP_MS", "2")) / 1000)
    server = await asyncio.start_unix_server(lambda r, w: handle(batch, r, w), socket, backlog=4096)
    announce = os.environ.get("STANDIN_ANNOUNCE")
    if announce:
        with open(announce, "w") as out:
            out.write(socket)
    async with server:
        await batch.run()


if __name__ == "__main__":
    if "--version" in sys.argv:
        print(VERSION)
        sys.exit(0)
    asyncio.run(main(sys.argv[sys.argv.index("--host") + 1]))
