"""Anthropic's Messages API: `/anthropic/v1/messages[/count_tokens]`, `/v1/messages[/count_tokens]` and
`/engines[/{backend}]/v1/messages[/count_tokens]` (contract 2.2). The router: it parses the body, calls
server/anthropic_serving.py and answers.

llama-server (b11434) serves `/v1/messages` and `/v1/messages/count_tokens` natively, streaming Anthropic's
events itself (message_start, content_block_*, message_delta with usage, message_stop), tool use included.
So these routes check the request and the model here, then relay the engine's bytes unchanged: one
translation fewer, and the engine's tracks Anthropic's format as clients change. What we add is Anthropic's
error shape everywhere (server/errors.py shapes errors by path): for an unknown model (404
not_found_error), a malformed body (400 invalid_request_error, `max_tokens` included: Anthropic requires
it), an engine error status, and an engine that dies mid-stream (an `error` event). A non-streamed request
is asked for as a stream and assembled (server/served_call.py), so that a client that leaves stops it. And
`role: "system"` messages inside `messages` (Claude Code 2.1.19x) are moved where every chat template
takes them before anything else (compat/anthropic.py, `with_system_messages_placed`).

`/anthropic/v1/models[/{id}]` lists the store's models in Anthropic's shape (its SDK's `models.list()`
pages with `has_more` and `last_id`); the IDs are those of the OpenAI list, usable as `model`. DMR has no
such route; its `/v1/models` asked by the Anthropic SDK answers the same (server/openai_api.py).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Query, Request, Response

from modelrunner.compat import anthropic as shapes
from modelrunner.compat.bodies import parse_json_object
from modelrunner.server.anthropic_serving import AnthropicServing
from modelrunner.server.lifecycle import Inference
from modelrunner.server.openai_api import anthropic_model, anthropic_models
from modelrunner.server.routes import ANTHROPIC_V1, BACKEND_V1, ENGINES_V1
from modelrunner.server.serving import respond


def build_anthropic_router(ctx: Inference) -> APIRouter:
    serving = AnthropicServing(ctx)
    router = APIRouter()

    async def handle(request: Request, backend: str | None, count_tokens: bool) -> Response:
        doc = shapes.with_system_messages_placed(parse_json_object(await request.body()))
        return respond(await serving.messages(doc, backend, count_tokens))

    for prefix in (ANTHROPIC_V1, ENGINES_V1):  # `/v1/messages`: the alias
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

    router.add_api_route(BACKEND_V1 + "/messages", messages_backend, methods=["POST"])
    router.add_api_route(BACKEND_V1 + "/messages/count_tokens", count_tokens_backend, methods=["POST"])

    @router.get(ANTHROPIC_V1 + "/models")
    def list_models(
        limit: int = Query(20, ge=1, le=1000), after_id: str | None = None, before_id: str | None = None
    ) -> dict[str, Any]:
        return anthropic_models(ctx.store, limit, after_id, before_id)

    @router.get(ANTHROPIC_V1 + "/models/{model_id:path}")
    def get_model(model_id: str) -> dict[str, Any]:
        return anthropic_model(ctx.store.get(model_id))

    return router


def _endpoint(
    handle: Callable[[Request, str | None, bool], Coroutine[Any, Any, Response]],
    backend: str | None,
    count_tokens: bool,
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    async def endpoint(request: Request) -> Response:
        return await handle(request, backend, count_tokens)

    return endpoint
