"""What every relay to an engine shares: ASGI types, the request as the engine gets it, the head of the
answer as the client gets it, and how a cut stream is ended.

The relays themselves: the HTTP front's byte relay (server/front.py), the raw ASGI relay of the OpenAI
routes (server/inference.py) and the engine calls of the translated APIs (server/upstream.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from modelrunner.response_reader import is_event_stream
from modelrunner.wire import EVENT_END, event_closed

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
T = TypeVar("T")

# Hop-by-hop headers, ours (server, date) and CORS headers the engine must not decide (DMR strips them too).
DROPPED = frozenset({b"connection", b"keep-alive", b"access-control-allow-origin", b"server", b"date"})
# The ASGI relay hands uvicorn the body's data, which uvicorn frames again: the engine's Transfer-Encoding
# goes too. The HTTP front passes the body on as the engine framed it, so it keeps it.
_DROPPED_REFRAMED = DROPPED | {b"transfer-encoding"}
_FORWARDED = (b"content-type", b"accept", b"accept-encoding")
EVENT_STREAM_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


def engine_died_body(message: str) -> bytes:
    """DMR's JSON for a runner that died before its answer started (the 500 of scheduling/runner.go's
    proxy ErrorHandler, OpenAIErrorResponse): a whole body, which the SDKs read for its `message`."""
    return json.dumps(
        {"type": "error", "code": None, "message": message, "param": None, "sequence_number": 1}
    ).encode()


def stream_end_event(tail: bytes, message: str) -> bytes:
    """The event that ends a cut OpenAI stream (chat or completions: the only streams these relays cut): a
    half-sent event is closed first (`tail`: the stream's last bytes, wire.tail_after), then OpenAI's
    stream error, `{"error": {...}}`, which the OpenAI SDKs raise as an APIError. DMR writes no event
    there (its proxy only cuts the body), and its `{"type": "error"}` object is a Responses event: an SDK
    reading chat chunks takes it for a chunk without `choices`."""
    error = {"message": message, "type": "server_error", "code": None, "param": None}
    return event_closed(tail) + b"data: " + json.dumps({"error": error}).encode() + EVENT_END


def request_bytes(
    method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes, keep_alive: bool = False
) -> bytes:
    """The request as the engine gets it, with only the headers it needs; the connection closes after the
    answer unless it is kept alive (the HTTP front's EnginePool)."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"host: localhost"]
    if not keep_alive:
        lines.append(b"connection: close")
    lines += [name + b": " + value for name, value in headers if name in _FORWARDED]
    if not any(name == b"content-type" for name, _ in headers):
        lines.append(b"content-type: application/json")
    lines.append(b"content-length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def client_headers(
    headers: list[tuple[bytes, bytes]], reframed: bool = True
) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The engine's response headers as the client gets them (`reframed`: its body is framed anew), and
    whether the body is an event stream."""
    dropped = _DROPPED_REFRAMED if reframed else DROPPED
    out = [(k, v) for k, v in headers if k not in dropped]
    streaming = any(k == b"content-type" and is_event_stream(v) for k, v in out)
    if streaming:
        out += EVENT_STREAM_HEADERS
    return out, streaming


async def retry_full_backlog(open_connection: Callable[[], Awaitable[T]]) -> T:
    """Connect to an engine; a full listen backlog (EAGAIN on Unix sockets) is retried for a moment."""
    for attempt in range(100):
        try:
            return await open_connection()
        except BlockingIOError:
            await asyncio.sleep(0.001 * (attempt + 1))
    return await open_connection()


def json_bytes(payload: object) -> bytes:
    return payload if isinstance(payload, bytes) else json.dumps(payload).encode()


async def send_json(
    send: Send, status: int, payload: object, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A whole JSON response through a raw ASGI `send` (payload: an object, or JSON bytes as they are)."""
    body = json_bytes(payload)
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": [*start_headers, *(headers or [])]}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
