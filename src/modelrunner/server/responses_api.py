"""The OpenAI Responses API (contract 2.2): `POST`, `GET {id}`, `DELETE {id}`, `GET {id}/input_items` under
`/responses`, `/v1/responses` (through the alias), `/engines/responses`, `/engines/v1/responses` and
`/engines/{backend}/v1/responses`. Translated to chat completions (compat/responses.py says why); errors
are OpenAI's shape, from server/errors.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from modelrunner.compat import responses as shapes
from modelrunner.compat.bodies import parse_json_object
from modelrunner.engines.base import Mode
from modelrunner.errors import ModelNotFound, ModelRunnerError
from modelrunner.server.lifecycle import Inference
from modelrunner.server.upstream import EngineCall, call_engine

PREFIXES = ("/responses", "/engines/responses", "/engines/v1/responses")


def build_responses_router(ctx: Inference) -> APIRouter:
    router = APIRouter()
    store = shapes.ResponseStore()

    def stored(response_id: str) -> shapes.StoredResponse:
        item = store.get(response_id)
        if item is None:
            raise ModelNotFound(
                f"no response with id {response_id[:80]!r} (responses are kept for 1 hour, within "
                "MODEL_RUNNER_RESPONSES_MAX_BYTES)"
            )
        return item

    async def create(request: Request, backend: str | None) -> Response:
        checked = shapes.check_request(parse_json_object(await request.body()))
        history: list[dict[str, Any]] = []
        if checked.previous_response_id:
            history = list(stored(checked.previous_response_id).conversation)
        items = shapes.input_items(checked.input)
        messages = history + shapes.chat_messages(items)
        call = await call_engine(
            ctx,
            checked.model,
            "/v1/chat/completions",
            shapes.chat_body(checked, messages),
            Mode.COMPLETION,
            None,
            backend,
        )
        response_id, created_at = shapes.new_id("resp"), int(time.time())

        def remember(response: dict[str, Any]) -> None:
            if checked.store:
                conversation = messages + shapes.chat_messages(response["output"])
                store.put(shapes.StoredResponse(response, items, conversation))

        if checked.stream:
            return StreamingResponse(
                _stream(call, checked, response_id, created_at, remember),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
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
            shapes.output_items(choice.get("message") or {}),
            answer.get("usage"),
            choice.get("finish_reason"),
        )
        remember(response)
        return JSONResponse(response)

    async def _stream(
        call: EngineCall,
        checked: shapes.ResponsesRequest,
        response_id: str,
        created_at: int,
        remember: Callable[[dict[str, Any]], None],
    ) -> AsyncIterator[bytes]:
        writer = shapes.EventWriter()
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

    def get_response(response_id: str) -> dict[str, Any]:
        return stored(response_id).response

    def delete_response(response_id: str) -> dict[str, Any]:
        if not store.delete(response_id):
            raise ModelNotFound(f"no response with id {response_id[:80]!r}")
        return {"id": response_id, "object": "response", "deleted": True}

    def list_input_items(
        response_id: str,
        order: str = Query("desc", pattern="^(asc|desc)$"),
        limit: int = Query(20, ge=1, le=100),
        after: str | None = None,
    ) -> dict[str, Any]:
        items = list(stored(response_id).input_items)
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

    def create_for(backend: str | None) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        async def endpoint(request: Request) -> Response:
            return await create(request, backend)

        return endpoint

    async def create_backend(request: Request, backend: str) -> Response:
        return await create(request, backend)

    for prefix in PREFIXES:
        router.add_api_route(prefix, create_for(None), methods=["POST"], name=f"create {prefix}")
        router.add_api_route(prefix + "/{response_id}", get_response, methods=["GET"])
        router.add_api_route(prefix + "/{response_id}", delete_response, methods=["DELETE"])
        router.add_api_route(prefix + "/{response_id}/input_items", list_input_items, methods=["GET"])
    backend_prefix = "/engines/{backend}/v1/responses"
    router.add_api_route(backend_prefix, create_backend, methods=["POST"])
    for path, endpoint, method in (
        ("/{response_id}", get_response, "GET"),
        ("/{response_id}", delete_response, "DELETE"),
        ("/{response_id}/input_items", list_input_items, "GET"),
    ):
        router.add_api_route(backend_prefix + path, endpoint, methods=[method])
    return router
