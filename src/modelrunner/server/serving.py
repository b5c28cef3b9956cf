"""What the serving classes (server/*_serving.py) return: plain data (a JSON document, an answer's bytes as
the engine sent them, or a stream), so that each API's logic is tested without HTTP; `respond` is the
routers' one way to turn them into responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Response
from fastapi.responses import JSONResponse, StreamingResponse

Document = dict[str, Any]

NDJSON = "application/x-ndjson"
# no cache or proxy buffering between the engine's tokens and the client
_EVENT_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass(frozen=True)
class LineStream:
    """An answer sent as it is made, one JSON document a line (Ollama's NDJSON)."""

    lines: AsyncIterator[bytes]


@dataclass(frozen=True)
class EventStream:
    """An answer sent as it is made, as server-sent events (OpenAI's and Anthropic's streams)."""

    events: AsyncIterator[bytes]


@dataclass(frozen=True)
class RawAnswer:
    """A JSON answer relayed as the engine sent it, its status included."""

    status: int
    body: bytes


Result = Document | LineStream | EventStream | RawAnswer


def respond(result: Result) -> Response:
    if isinstance(result, LineStream):
        return StreamingResponse(result.lines, media_type=NDJSON)
    if isinstance(result, EventStream):
        return StreamingResponse(result.events, media_type="text/event-stream", headers=_EVENT_HEADERS)
    if isinstance(result, RawAnswer):
        return Response(result.body, status_code=result.status, media_type="application/json")
    return JSONResponse(result)
