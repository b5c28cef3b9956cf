"""The OpenAI Responses API (contract 2.2): `POST`, `GET {id}`, `DELETE {id}`, `GET {id}/input_items` under
`/responses`, `/v1/responses` (through the alias), `/engines/responses`, `/engines/v1/responses` and
`/engines/{backend}/v1/responses`. The router: it checks the body and the query, calls
server/responses_serving.py and answers; errors are OpenAI's shape, from server/errors.py.

Tools the engine cannot have (hosted ones such as Codex's `web_search`: compat/responses.py,
`dropped_tools`) are named in the answer's `x-modelrunner-dropped-tools` header and in a log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response

from modelrunner.compat import responses as shapes
from modelrunner.compat.bodies import parse_json_object
from modelrunner.server.lifecycle import Inference
from modelrunner.server.responses_serving import ResponsesServing
from modelrunner.server.routes import BACKEND_V1, ENGINES, ENGINES_V1
from modelrunner.server.serving import respond

PREFIXES = ("/responses", ENGINES + "/responses", ENGINES_V1 + "/responses")  # `/v1/responses`: the alias
DROPPED_TOOLS_HEADER = "x-modelrunner-dropped-tools"

log = logging.getLogger(__name__)


def build_responses_router(ctx: Inference) -> APIRouter:
    serving = ResponsesServing(ctx)
    router = APIRouter()

    async def create(request: Request, backend: str | None) -> Response:
        checked = shapes.check_request(parse_json_object(await request.body()))
        dropped = shapes.dropped_tools(checked.tools)
        if dropped:
            log.info("responses: tools not available locally, dropped: %s", ", ".join(dropped))
        answer = respond(await serving.create(checked, backend))
        if dropped:
            answer.headers[DROPPED_TOOLS_HEADER] = ", ".join(dropped)
        return answer

    def get_response(response_id: str) -> dict[str, Any]:
        return serving.get(response_id)

    def delete_response(response_id: str) -> dict[str, Any]:
        return serving.delete(response_id)

    def list_input_items(
        response_id: str,
        order: str = Query("desc", pattern="^(asc|desc)$"),
        limit: int = Query(20, ge=1, le=100),
        after: str | None = None,
    ) -> dict[str, Any]:
        direction: Literal["asc", "desc"] = "asc" if order == "asc" else "desc"
        return serving.input_items(response_id, direction, limit, after)

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
    backend_prefix = BACKEND_V1 + "/responses"
    router.add_api_route(backend_prefix, create_backend, methods=["POST"])
    for path, endpoint, method in (
        ("/{response_id}", get_response, "GET"),
        ("/{response_id}", delete_response, "DELETE"),
        ("/{response_id}/input_items", list_input_items, "GET"),
    ):
        router.add_api_route(backend_prefix + path, endpoint, methods=[method])
    return router
