"""Anthropic's Messages API: `/anthropic/v1/messages[/count_tokens]`, `/v1/messages[/count_tokens]` and
`/engines[/{backend}]/v1/messages[/count_tokens]` (contract 2.2).

llama-server (b11434) serves `/v1/messages` and `/v1/messages/count_tokens` natively, streaming Anthropic's
events itself (message_start, content_block_*, message_delta with usage, message_stop), tool use included.
So these routes check the request and the model here, then relay the engine's bytes unchanged: one
translation fewer, and the engine's tracks Anthropic's format as clients change. What we add is Anthropic's
error shape everywhere (server/errors.py shapes errors by path): for an unknown model (404
not_found_error), a malformed body (400 invalid_request_error, `max_tokens` included: Anthropic requires
it), an engine error status, and an engine that dies mid-stream (an `error` event). A non-streamed request
is asked for as a stream and assembled (server/upstream.py), so that a client that leaves stops it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from modelrunner.compat import anthropic as shapes
from modelrunner.compat.bodies import parse_json_object
from modelrunner.engines.base import Mode
from modelrunner.errors import ModelNotFound
from modelrunner.scheduler.durations import parse_keep_alive
from modelrunner.server.lifecycle import Inference
from modelrunner.server.upstream import READ_ERRORS, EngineCall, call_engine

_MESSAGE_START = b"event: message_start"


async def relay_events(call: EngineCall, model: str) -> AsyncIterator[bytes]:
    """The engine's event stream, as it comes, with two repairs: a stream that does not open with
    `message_start` gets one (llama-server b11434 skips it when the first tokens are an incomplete UTF-8
    sequence it holds back, and Anthropic's clients cannot build the message without it), and an engine
    that dies mid-stream (or a daemon that stops) ends it with an `error` event."""
    tail = b"\n\n"
    opening: bytes | None = b""  # the first bytes, until it is clear how the stream opens
    try:
        async for chunk in call.chunks():
            if opening is not None:
                opening += chunk
                if len(opening) < len(_MESSAGE_START):
                    continue
                chunk, opening = opening, None
                if not chunk.startswith(_MESSAGE_START):
                    yield shapes.message_start_event(model)
            yield chunk
            tail = (tail + chunk)[-2:]
        if opening:  # a stream shorter than the event name
            yield opening
    except READ_ERRORS as exc:
        event = shapes.error_body(500, call.exchange.failure(exc))
        boundary = b"" if tail == b"\n\n" else b"\n\n"  # end a half-sent event first
        yield boundary + b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    finally:
        await call.close()


def build_anthropic_router(ctx: Inference) -> APIRouter:
    router = APIRouter()

    async def handle(request: Request, backend: str | None, count_tokens: bool) -> Response:
        doc = parse_json_object(await request.body())
        checked = shapes.check_request(doc, count_tokens)
        try:
            ctx.store.get(checked.model)
        except ModelNotFound:
            raise ModelNotFound(f"model: {checked.model[:200]} not found") from None
        keep_alive = parse_keep_alive(doc.pop("keep_alive")) if "keep_alive" in doc else None
        path = "/v1/messages/count_tokens" if count_tokens else "/v1/messages"
        call = await call_engine(ctx, checked.model, path, doc, Mode.COMPLETION, keep_alive, backend)
        if doc.get("stream") and not count_tokens:
            return StreamingResponse(
                relay_events(call, checked.model),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        try:
            status, body = await call.answer()
        finally:
            await call.close()
        return Response(body, status_code=status, media_type="application/json")

    for prefix in ("/anthropic/v1", "/engines/v1"):
        router.add_api_route(
            prefix + "/messages", _endpoint(handle, None, False), methods=["POST"], name=f"{prefix} messages"
        )
        router.add_api_route(
            prefix + "/messages/count_tokens",
            _endpoint(handle, None, True),
            methods=["POST"],
            name=f"{prefix} count_tokens",
        )

    async def messages_backend(request: Request, backend: str) -> Response:
        return await handle(request, backend, False)

    async def count_tokens_backend(request: Request, backend: str) -> Response:
        return await handle(request, backend, True)

    router.add_api_route("/engines/{backend}/v1/messages", messages_backend, methods=["POST"])
    router.add_api_route(
        "/engines/{backend}/v1/messages/count_tokens", count_tokens_backend, methods=["POST"]
    )
    return router


def _endpoint(
    handle: Callable[[Request, str | None, bool], Coroutine[Any, Any, Response]],
    backend: str | None,
    count_tokens: bool,
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    async def endpoint(request: Request) -> Response:
        return await handle(request, backend, count_tokens)

    return endpoint
