"""What the OpenAI Responses API does, without HTTP: create a response (translated to chat completions,
compat/responses.py says why), read, delete and page through stored ones. Methods take checked requests
and return documents or an event stream, or raise the ModelRunnerError that server/errors.py answers in
OpenAI's shape; server/responses_api.py is the router.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from modelrunner.compat import responses as shapes
from modelrunner.engines.base import Mode
from modelrunner.errors import ModelNotFound, ModelRunnerError
from modelrunner.server import keepalive
from modelrunner.server.engine_request import call_engine
from modelrunner.server.errors import RESPONSES, exception_payload
from modelrunner.server.lifecycle import Inference
from modelrunner.server.served_call import ServedCall
from modelrunner.server.serving import Document, EventStream


class ResponsesServing:
    """The Responses API over the daemon's inference, with the responses it keeps (in memory, bounded)."""

    def __init__(self, ctx: Inference) -> None:
        self.ctx = ctx
        self.store = shapes.ResponseStore()

    async def create(
        self, checked: shapes.ResponsesRequest, backend: str | None = None
    ) -> Document | EventStream:
        history: list[Document] = []
        if checked.previous_response_id:
            history = list(self.stored(checked.previous_response_id).conversation)
        items = shapes.input_items(checked.input)
        messages = history + shapes.chat_messages(items)
        start = call_engine(
            self.ctx,
            checked.model,
            "/v1/chat/completions",
            shapes.chat_body(checked, messages),
            Mode.COMPLETION,
            None,
            backend,
        )
        every = keepalive.interval() if checked.stream else 0.0
        started = await keepalive.within(start, every, ServedCall.close)
        response_id, created_at = shapes.new_id("resp"), int(time.time())

        def remember(response: Document) -> None:
            if checked.store:
                conversation = messages + shapes.chat_messages(response["output"])
                self.store.put(shapes.StoredResponse(response, items, conversation))

        def events(call: ServedCall) -> AsyncIterator[bytes]:
            return _stream(call, checked, response_id, created_at, remember)

        if isinstance(started, asyncio.Task):  # the stream's head goes out now, comments while it waits
            ping = keepalive.SSE_COMMENT
            return EventStream(
                keepalive.waiting(started, events, ping, every, _error_event, ServedCall.close)
            )
        call = started
        if checked.stream:
            return EventStream(keepalive.pinged(events(call), keepalive.SSE_COMMENT, every))
        try:
            answer = await call.json()
        finally:
            await call.close()
        choice = (answer.get("choices") or [{}])[0]
        response = shapes.response_object(
            response_id,
            checked,
            created_at,
            "completed",
            shapes.output_items(choice.get("message") or {}, checked),
            answer.get("usage"),
            choice.get("finish_reason"),
        )
        remember(response)
        return response

    def get(self, response_id: str) -> Document:
        return self.stored(response_id).response

    def delete(self, response_id: str) -> Document:
        if not self.store.delete(response_id):
            raise ModelNotFound(f"no response with id {response_id[:80]!r}")
        return {"id": response_id, "object": "response", "deleted": True}

    def input_items(
        self, response_id: str, order: Literal["asc", "desc"], limit: int, after: str | None
    ) -> Document:
        """A page of the items a response was asked with (`order`, `limit` 1..100: the router checks them)."""
        items = list(self.stored(response_id).input_items)
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item["id"] for item in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }

    def stored(self, response_id: str) -> shapes.StoredResponse:
        item = self.store.get(response_id)
        if item is None:
            raise ModelNotFound(
                f"no response with id {response_id[:80]!r} (responses are kept for 1 hour, within "
                "MODEL_RUNNER_RESPONSES_MAX_BYTES)"
            )
        return item


def _error_event(exc: ModelRunnerError) -> bytes:
    """A refusal that came after the stream's head: the Responses stream's `error` event."""
    error = exception_payload(RESPONSES, exc)["error"]
    return shapes.EventWriter().event("error", code=str(error["code"]), message=error["message"], param=None)


async def _stream(
    call: ServedCall,
    checked: shapes.ResponsesRequest,
    response_id: str,
    created_at: int,
    remember: Callable[[Document], None],
) -> AsyncIterator[bytes]:
    """The engine's chunks as the Responses API's events; an engine that fails mid-stream ends it with
    `response.failed`."""
    writer = shapes.EventWriter(checked)
    start = shapes.response_object(response_id, checked, created_at, "in_progress", [])
    yield writer.event("response.created", response=start)
    yield writer.event("response.in_progress", response=start)
    usage: dict[str, Any] | None = None
    finish: str | None = None
    try:
        async for chunk in call.events():
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                events: list[bytes] = []
                if delta.get("reasoning_content"):
                    events += writer.reasoning(delta["reasoning_content"])
                if delta.get("content"):
                    events += writer.text(delta["content"])
                if delta.get("tool_calls"):
                    events += writer.tool_calls(delta["tool_calls"])
                finish = choice.get("finish_reason") or finish
                for event in events:
                    yield event
        for event in writer.close_item():
            yield event
        done = shapes.response_object(
            response_id, checked, created_at, "completed", writer.output, usage or {}, finish
        )
        remember(done)
        # cut by max_output_tokens: OpenAI ends such a stream with `response.incomplete`
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        yield writer.event(kind, response=done)
    except ModelRunnerError as exc:
        error = {"code": "server_error", "message": exc.message}
        failed = shapes.response_object(
            response_id, checked, created_at, "failed", writer.output, usage, error=error
        )
        yield writer.event("response.failed", response=failed)
    finally:
        await call.close()
