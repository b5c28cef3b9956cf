"""The inference relay: request bytes to a runner's Unix socket, response bytes back, nothing buffered.

This is the one hot path, so it is a raw ASGI handler over asyncio streams, not FastAPI + an HTTP client
library (measured in bench/proxy.py). It reads only the upstream status line and headers, de-chunks the
body as it arrives and hands each piece to the server at once. A client that goes away closes the
upstream connection, which makes the engine stop generating.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, TypeVar

from modelrunner.http1 import MAX_HEAD, UpstreamError, body_chunks, read_head

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
T = TypeVar("T")

# Hop-by-hop headers, and CORS headers the engine must not decide (DMR strips them too).
_DROPPED = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"access-control-allow-origin",
    b"server",
    b"date",
}
_FORWARDED = (b"content-type", b"accept", b"accept-encoding")


def engine_died_body(message: str) -> bytes:
    """DMR's JSON for a runner that died during a request."""
    return json.dumps(
        {"type": "error", "code": None, "message": message, "param": None, "sequence_number": 1}
    ).encode()


def request_bytes(method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    """The request as the engine gets it: one connection per request, only the headers it needs."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"host: localhost", b"connection: close"]
    lines += [name + b": " + value for name, value in headers if name in _FORWARDED]
    lines.append(b"content-length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def relay(scope: Scope, receive: Receive, send: Send, socket: Path, path: str, body: bytes) -> None:
    """Proxy one request to the engine on `socket` and stream its answer back to the client."""
    try:
        reader, writer = await connect(socket)
    except OSError:
        await _send_error(send, 502, "the engine is not reachable")
        return
    watcher = asyncio.get_running_loop().create_task(_close_on_disconnect(receive, writer))
    started = False
    tail = b"\n\n"  # the last two bytes sent, to know whether an SSE event was cut
    try:
        writer.write(request_bytes(scope["method"], path, scope["headers"], body))
        await writer.drain()
        status, headers = await read_head(reader)
        out = [(k, v) for k, v in headers if k not in _DROPPED]
        streaming = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
        if streaming:
            out += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        await send({"type": "http.response.start", "status": status, "headers": out})
        started = True
        async for chunk in body_chunks(reader, headers):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            tail = chunk[-2:] if len(chunk) >= 2 else tail[-1:] + chunk
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except (UpstreamError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
        if watcher.done():
            return  # the client left; nothing to tell it
        message = f"the engine stopped while answering: {exc}"
        if not started:
            await _send_error(send, 500, message, engine_died_body(message))
        else:  # mid-stream: the status is sent, so say it in the stream and end it
            boundary = b"" if tail == b"\n\n" else b"\n\n"  # end a half-sent event first
            error = boundary + b"data: " + engine_died_body(message) + b"\n\n"
            await send({"type": "http.response.body", "body": error, "more_body": False})
    finally:
        watcher.cancel()
        writer.close()


async def connect(socket: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await retry_full_backlog(lambda: asyncio.open_unix_connection(str(socket), limit=MAX_HEAD))


async def retry_full_backlog(open_connection: Callable[[], Awaitable[T]]) -> T:
    """Connect to an engine; a full listen backlog (EAGAIN on Unix sockets) is retried for a moment."""
    for attempt in range(100):
        try:
            return await open_connection()
        except BlockingIOError:
            await asyncio.sleep(0.001 * (attempt + 1))
    return await open_connection()


async def _close_on_disconnect(receive: Receive, writer: asyncio.StreamWriter) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            writer.close()  # the engine sees the socket close and stops generating
            return


async def send_json(
    send: Send, status: int, payload: object, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A whole JSON response through a raw ASGI `send` (payload: an object, or JSON bytes as they are)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": [*start_headers, *(headers or [])]}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_error(send: Send, status: int, message: str, body: bytes | None = None) -> None:
    await send_json(
        send, status, body or {"error": {"message": message, "type": "server_error", "code": status}}
    )
