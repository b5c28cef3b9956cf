"""OpenAI-style inference routes, served as raw ASGI in front of the FastAPI app.

`/engines[/{backend}]/v1/{chat/completions,completions,embeddings,images/generations}`,
`/engines[/{backend}]/{rerank,score}` and the `/v1/...`, `/rerank`, `/score` aliases (server/routes.py,
`match_route`): read the body once, take only its `model` field (and check what engines would answer
wrongly), get a runner through the request's lifecycle and relay the bytes. The HTTP front
(server/front.py) answers most of these requests itself with the same `prepare`; this handler serves those
it hands over.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from modelrunner.compat import assemble, tool_rescue
from modelrunner.engines.base import Mode
from modelrunner.errors import BadRequest, MethodNotAllowed, ModelRunnerError
from modelrunner.scheduler.durations import parse_keep_alive
from modelrunner.scheduler.runner import Runner
from modelrunner.scheduler.scheduler import Busy
from modelrunner.server import engine_request, keepalive, lifecycle
from modelrunner.server.engine_request import EngineRequest
from modelrunner.server.errors import OPENAI, error_body, exception_payload
from modelrunner.server.handed_over import asks_for_stream
from modelrunner.server.lifecycle import Exchange, Inference
from modelrunner.server.proxy import (
    Receive,
    Scope,
    Send,
    client_headers,
    engine_died_body,
    send_json,
    stream_end_event,
)
from modelrunner.server.routes import Route
from modelrunner.server.security import MAX_BODY, BodyTooLarge
from modelrunner.server.served_call import ServedCall
from modelrunner.server.upstream import READ_ERRORS, EngineUnreachable
from modelrunner.wire import EVENT_END, tail_after

__all__ = ["MAX_BODY", "InferenceHandler", "Prepared", "error_parts"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """An OpenAI request ready for its engine (server/engine_request.py), its bytes, and how to answer."""

    request: EngineRequest
    body: bytes
    whole: bool  # the answer is read whole: assembled, checked, or an embedding whose error may be reworded

    @property
    def runner(self) -> Runner:
        return self.request.runner

    def call(self, exchange: Exchange) -> ServedCall:
        """The engine call that sends this request and treats its answer as prepared (both relays)."""
        return self.request.call(exchange)


# The roles OpenAI's chat API takes (its error for another lists them in this order).
CHAT_ROLES = ("system", "assistant", "user", "function", "tool", "developer")


_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")


def check_request(route: Route, doc: dict[str, Any]) -> None:
    """What engines would answer wrongly: llama-server generates from an empty conversation, fails a message
    without a role with a 500 (which SDKs retry) and takes any other role, and reads a negative token limit
    as "no limit"; OpenAI's API refuses them all (its words). -1 and 0 stay llama.cpp's: clients of
    llama-server send them (no limit; prompt only)."""
    for name in _TOKEN_LIMITS:
        value = doc.get(name)
        if value is None:
            continue
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not whole:
            kind = type(value).__name__
            raise BadRequest(f"Invalid type for '{name}': expected an integer, but got {kind}.")
        if value < -1:
            raise BadRequest(
                f"Invalid '{name}': integer below minimum value. Expected a value >= 1 (or -1: no limit), "
                f"but got {int(value)} instead."
            )
    if route.upstream_path == assemble.CHAT:
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: must be a non-empty list of messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise BadRequest(f"Invalid type for 'messages[{i}]': expected an object.")
            role = message.get("role")
            if role is None:
                raise BadRequest(f"Missing required parameter: 'messages[{i}].role'.")
            if role not in CHAT_ROLES:
                shown = str(role)[:40]
                supported = ", ".join(f"'{r}'" for r in CHAT_ROLES[:-1]) + f", and '{CHAT_ROLES[-1]}'"
                raise BadRequest(
                    f"Invalid value: '{shown}'. Supported values are: {supported}.",
                )


class InferenceHandler:
    def __init__(self, inference: Inference) -> None:
        self.inference = inference

    async def prepare(self, route: Route, body: bytes, preload: bool = False) -> Prepared:
        """A runner for the request's model, held by the request's exchange, and the body to send it: the
        OpenAI API's own checks, then the preparation every API family shares (server/engine_request.py)."""
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply
            raise BadRequest("the request body is not valid JSON") from None
        name = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not isinstance(name, str) or not name.strip():
            raise BadRequest("the request has no model field")
        keep_alive = parse_keep_alive(doc["keep_alive"]) if "keep_alive" in doc else None
        if not preload:
            check_request(route, doc)
        ready = await engine_request.prepare(
            self.inference, name, route.upstream_path, doc, route.mode, keep_alive, route.backend, preload
        )
        streamed = bool(doc.get("stream"))  # as the client asked (assembling asks the engine for a stream)
        whole = (
            ready.assembling is not None
            or (ready.tools is not None and not streamed)
            or (ready.constraint is not None and not streamed)
            or route.mode in (Mode.EMBEDDING, Mode.RERANKING)
        )
        return Prepared(ready, ready.body(body), whole)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, route: Route) -> None:
        send = paced = keepalive.EarlyHead(send)  # a stream that waits gets its head and comments early
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed("use POST for this route")
            preload = _header(scope, b"x-preload-only") == b"true"
            data = await read_body(receive)
            if not preload:
                paced.start(keepalive.interval(), lambda: asks_for_stream(route.upstream_path, data))
            prepared = await self.prepare(route, data, preload)
            if preload:
                await send(
                    {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
                )
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await self._relay(prepared, route, scope["headers"], send)
        except ModelRunnerError as exc:
            status, body, headers = error_parts(exc)
            await send_json(send, status, body, headers)
        except BodyTooLarge as exc:
            await send_json(send, 413, error_body(413, str(exc.detail)), [(b"connection", b"close")])
        finally:
            await paced.stop()

    async def _relay(
        self, prepared: Prepared, route: Route, headers: list[tuple[bytes, bytes]], send: Send
    ) -> None:
        exchange = lifecycle.current()
        call = prepared.call(exchange)
        started = streaming = False
        tail = EVENT_END  # the last bytes sent, to know whether an SSE event was cut
        try:
            await call.send(route.upstream_path, prepared.body, headers)
            if prepared.whole or call.engine.status >= 400:  # a refusal is read whole: `answer` rewords it
                status, body = await call.answer()
                await send_json(send, status, body)
                return
            out, streaming = client_headers(call.engine.headers)
            await send({"type": "http.response.start", "status": call.engine.status, "headers": out})
            started = True
            rescued = streaming and prepared.request.tools is not None
            chunks = rescued_events(call) if rescued else call.relayed()
            if streaming:  # a prefill after the engine's head: comments until its first events
                chunks = keepalive.pinged(chunks, keepalive.SSE_COMMENT, keepalive.interval())
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                tail = tail_after(tail, chunk)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ModelRunnerError, *READ_ERRORS) as exc:
            if exchange.client_gone:
                return  # nothing to tell it
            message = exc.message if isinstance(exc, ModelRunnerError) else exchange.failure(exc)
            if not started:
                if isinstance(exc, EngineUnreachable):
                    await send_json(send, 502, error_body(502, message))
                else:
                    await send_json(send, 500, engine_died_body(message))
            elif streaming:  # the status is sent: say it in the stream and end it
                await send(
                    {
                        "type": "http.response.body",
                        "body": stream_end_event(tail, message),
                        "more_body": False,
                    }
                )
            else:
                raise  # a cut body that is not a stream: only closing the connection says so
        finally:
            await call.close()


def rescues_stream(route: Route, body: bytes) -> bool:
    """A streamed chat request that declares tools: its chunks are rewritten where calls were written as
    text (compat/tool_rescue.py), which the HTTP front's byte relay cannot do. Only a body that names
    `tools` is parsed here (one that escapes the word is relayed as it is)."""
    if route.upstream_path != assemble.CHAT or b'"tools"' not in body:
        return False
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return (
        isinstance(doc, dict)
        and bool(doc.get("stream"))
        and tool_rescue.declared(assemble.CHAT, doc) is not None
    )


async def rescued_events(call: ServedCall) -> AsyncIterator[bytes]:
    """A chat stream's events written anew from its chunks, as llama-server writes them (compact JSON),
    after ServedCall.events made its calls written as text calls."""
    async for doc in call.events():
        yield b"data: " + json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode() + EVENT_END
    yield b"data: [DONE]" + EVENT_END


async def read_body(receive: Receive) -> bytes:
    """The request body (its size is bounded as it arrives, by the security middleware)."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise lifecycle.ClientGone("the client disconnected")
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def error_parts(exc: ModelRunnerError) -> tuple[int, dict[str, object], list[tuple[bytes, bytes]]]:
    """Status, JSON body and extra headers of the answer to a refused inference request."""
    headers: list[tuple[bytes, bytes]] = []
    if isinstance(exc, Busy):
        headers.append((b"retry-after", str(exc.retry_after).encode()))
    elif isinstance(exc, MethodNotAllowed):
        headers.append((b"allow", b"POST"))
    return exc.status_code, exception_payload(OPENAI, exc), headers


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).lower()
    return None
