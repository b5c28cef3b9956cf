"""What Anthropic's Messages API does, without HTTP: check the request and the model, then relay the
engine's answer (server/anthropic_api.py, the router, says why the engine's own `/v1/messages` serves it),
or, for a tool choice llama-server's Messages would lose, make the message of its chat completion
(compat/anthropic_chat.py).
Methods take the parsed body and return the engine's bytes or event stream, or raise the ModelRunnerError
that server/errors.py answers in Anthropic's shape.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from modelrunner.compat import anthropic as shapes
from modelrunner.compat import anthropic_chat, billing, thinking_signature
from modelrunner.compat.assemble import CHAT
from modelrunner.compat.tool_rescue import MessageStreamRescue
from modelrunner.engines.base import Mode
from modelrunner.errors import ModelNotFound, ModelRunnerError
from modelrunner.scheduler.durations import parse_keep_alive
from modelrunner.server import keepalive
from modelrunner.server.engine_request import call_engine
from modelrunner.server.errors import exception_payload
from modelrunner.server.lifecycle import Inference
from modelrunner.server.routes import ANTHROPIC
from modelrunner.server.served_call import ServedCall
from modelrunner.server.serving import Document, EventStream, RawAnswer
from modelrunner.server.upstream import READ_ERRORS
from modelrunner.wire import EVENT_END, SSEDecoder, event_closed, event_document, tail_after

_MESSAGE_START = b"event: message_start"


class AnthropicServing:
    def __init__(self, ctx: Inference) -> None:
        self.ctx = ctx

    async def messages(
        self, doc: dict[str, Any], backend: str | None = None, count_tokens: bool = False
    ) -> RawAnswer | Document | EventStream:
        """`doc`, the request's JSON object, goes to the engine as it is, less our `keep_alive`."""
        checked = shapes.check_request(doc, count_tokens)
        try:
            self.ctx.store.get(checked.model)
        except ModelNotFound:
            raise ModelNotFound(f"model: {checked.model[:200]} not found") from None
        keep_alive = parse_keep_alive(doc.pop("keep_alive")) if "keep_alive" in doc else None
        path = "/v1/messages/count_tokens" if count_tokens else "/v1/messages"
        start = call_engine(self.ctx, checked.model, path, doc, Mode.COMPLETION, keep_alive, backend)
        if doc.get("stream") and not count_tokens:
            return await streamed(start, checked.model, doc)
        call = await start
        try:
            if call.path == CHAT:  # served through chat completions (compat/anthropic_chat.py)
                return anthropic_chat.message(await call.json(), checked.model)
            status, body = await call.answer()
            if call.unopened:  # assembled from a stream without message_start
                body = await Opening(call, checked.model, doc).counted(body)
            if status == 200:
                body = thinking_signature.signed_body(body)
        finally:
            await call.close()
        return RawAnswer(status, body)


async def streamed(start: Coroutine[Any, Any, ServedCall], model: str, doc: dict[str, Any]) -> EventStream:
    """The stream of a started engine call (of `doc`), with `event: ping` while it waits
    (server/keepalive.py)."""
    every = keepalive.interval()
    started = await keepalive.within(start, every, ServedCall.close)

    def events(call: ServedCall) -> AsyncIterator[bytes]:
        if call.path == CHAT:
            return chat_events(call, model)
        opening = Opening(call, model, doc)
        return rescued_events(call, opening) if call.tools is not None else relay_events(call, opening)

    if isinstance(started, asyncio.Task):  # the stream's head goes out now, pings while it waits
        ping = keepalive.ANTHROPIC_PING
        return EventStream(keepalive.waiting(started, events, ping, every, _error_event, ServedCall.close))
    return EventStream(keepalive.pinged(events(started), keepalive.ANTHROPIC_PING, every))


def _error_event(exc: ModelRunnerError) -> bytes:
    return shapes.event(exception_payload(ANTHROPIC, exc))


class Opening:
    """The `message_start` of a stream that lacks one (or the usage of a message assembled from one), with
    the prompt's tokens as the engine counts the same request (`/v1/messages/count_tokens`, asked only
    then: no event of the stream carries them). The count is the whole prompt, as `input_tokens`: what of
    it the prefix cache served is not known here."""

    def __init__(self, call: ServedCall, model: str, doc: dict[str, Any]) -> None:
        self.call, self.model, self.doc = call, model, doc

    async def input_tokens(self) -> int:
        asked = json.dumps(billing.neutralised(billing.COUNT_TOKENS, self.doc)).encode()
        counted = await self.call.engine.beside(billing.COUNT_TOKENS, asked)
        try:
            tokens = json.loads(counted).get("input_tokens") if counted is not None else None
        except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):  # not JSON, not an object
            tokens = None
        return tokens if isinstance(tokens, int) else 0

    async def event(self) -> bytes:
        return shapes.message_start_event(self.model, await self.input_tokens())

    async def counted(self, body: bytes) -> bytes:
        """An assembled message (`body`) with the prompt's tokens in its usage."""
        message = json.loads(body)
        message["usage"] = {**(message.get("usage") or {}), "input_tokens": await self.input_tokens()}
        return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


async def relay_events(call: ServedCall, start: Opening) -> AsyncIterator[bytes]:
    """The engine's event stream, as it comes, with three repairs: a stream that does not open with
    `message_start` gets one (llama-server b11434 skips it when the first tokens are an incomplete UTF-8
    sequence it holds back, and Anthropic's clients cannot build the message without it), its thinking
    blocks are signed (compat/thinking_signature.py; other events pass untouched), and an engine that dies
    mid-stream (or a daemon that stops) ends it with an `error` event."""
    signed = thinking_signature.SignedStream()
    sign = signed.feed
    opening: bytes | None = b""  # the first bytes, until it is clear how the stream opens
    tail = EVENT_END  # the last bytes sent, to end a half-sent event before the error's
    try:
        async for chunk in call.engine.chunks():
            if opening is not None:
                opening += chunk
                if len(opening) < len(_MESSAGE_START):
                    continue
                chunk, opening = opening, None
                if not chunk.startswith(_MESSAGE_START):
                    yield await start.event()
            out = sign(chunk)
            if out:
                tail = tail_after(tail, out)
                yield out
        if opening:  # a stream shorter than the event name
            yield opening
        out = signed.end()
        if out:
            yield out
    except READ_ERRORS as exc:
        yield event_closed(tail) + shapes.event(shapes.error_body(500, call.exchange.failure(exc)))
    finally:
        await call.close()


async def rescued_events(call: ServedCall, start: Opening) -> AsyncIterator[bytes]:
    """The engine's event stream, for a request that declares tools: each event parsed and written anew,
    after calls written as text were made `tool_use` blocks (compat/tool_rescue.py), with the same two
    repairs as `relay_events` (an opening `message_start`, an `error` event for an engine that dies) and
    its thinking blocks signed."""
    decoder, rescue, opened = SSEDecoder(), MessageStreamRescue(call.tools or {}), False
    signer = thinking_signature.StreamSigner()
    try:
        async for chunk in call.engine.chunks():
            for _, payload in decoder.feed(chunk):
                doc = event_document(payload)
                if doc is None:
                    continue
                if not opened and doc.get("type") != "message_start":
                    yield await start.event()
                opened = True
                for out in rescue.feed(doc):
                    instead = signer.feed(out)
                    for signed in [out] if instead is None else instead:
                        yield shapes.event(signed)
                if rescue.rescued:
                    call.exchange.tool_calls_rescued(rescue.rescued)
                    rescue.rescued = 0
    except READ_ERRORS as exc:
        yield shapes.event(shapes.error_body(500, call.exchange.failure(exc)))
    finally:
        await call.close()


async def chat_events(call: ServedCall, model: str) -> AsyncIterator[bytes]:
    """The events of a message served through chat completions (compat/anthropic_chat.py): the whole
    answer first (its call is rescued from the whole text), then its events; a failure is an `error`."""
    try:
        done = anthropic_chat.message(await call.json(), model)
    except ModelRunnerError as exc:
        yield _error_event(exc)
        return
    finally:
        await call.close()
    for event in anthropic_chat.message_events(done):
        yield event
