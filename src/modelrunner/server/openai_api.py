"""OpenAI model listing: `/engines[/{backend}]/v1/models[/{name}]` (and `/v1/models` through the alias).

The Anthropic SDK given the daemon's root as its base URL (as Claude Code's ANTHROPIC_BASE_URL) asks the
same `/v1/models`: a request that says `anthropic-version` gets Anthropic's shape, as `/anthropic/v1/models`
answers it. IDs are DMR's on every route (api.go ToOpenAI: the first tag as stored, `docker.io/ai/m:tag`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from modelrunner.compat import anthropic
from modelrunner.errors import BadRequest
from modelrunner.server.routes import BACKEND_V1, ENGINES_V1
from modelrunner.store.store import ModelStore, StoredModel

ANTHROPIC_VERSION = "anthropic-version"  # sent by every Anthropic SDK, by no OpenAI one


def openai_id(model: StoredModel) -> str:
    """The first tag as stored (`docker.io/ai/m:latest`), else the ID, as DMR's ToOpenAI; usable as
    `model` in requests, which normalise names."""
    return model.tags[0] if model.tags else model.id


def openai_model(model: StoredModel) -> dict[str, Any]:
    """api.go ToOpenAI; its DMRMetadata's fields are all `omitempty`: an unknown one is left out."""
    config = model.config.config
    dmr = {
        "context_window": model.config.context_size,
        "architecture": config.get("architecture"),
        "parameters": config.get("parameters"),
        "quantization": config.get("quantization"),
        "size": config.get("size"),
    }
    return {
        "id": openai_id(model),
        "object": "model",
        "created": model.config.created,
        "owned_by": "docker",
        "dmr": {key: value for key, value in dmr.items() if value is not None and value != ""},
    }


def anthropic_model(model: StoredModel) -> dict[str, Any]:
    return anthropic.model_object(openai_id(model), model.config.created)


def anthropic_models(
    store: ModelStore, limit: int, after_id: str | None, before_id: str | None
) -> dict[str, Any]:
    """A page of Anthropic's model list (its SDK's `models.list()`)."""
    return anthropic.model_page([anthropic_model(m) for m in store.list_models()], limit, after_id, before_id)


def _anthropic_limit(text: str | None) -> int:
    try:
        limit = int(text) if text is not None else 20
    except ValueError:
        limit = 0
    if not 1 <= limit <= 1000:
        raise BadRequest("limit: must be a number from 1 to 1000")
    return limit


def build_openai_router(store: ModelStore) -> APIRouter:
    router = APIRouter()

    def list_models(request: Request) -> dict[str, Any]:
        if ANTHROPIC_VERSION in request.headers:
            query = request.query_params
            limit = _anthropic_limit(query.get("limit"))
            return anthropic_models(store, limit, query.get("after_id"), query.get("before_id"))
        return {"object": "list", "data": [openai_model(m) for m in store.list_models()]}

    def get_model(name: str, request: Request) -> dict[str, Any]:
        if ANTHROPIC_VERSION in request.headers:
            return anthropic_model(store.get(name))
        return openai_model(store.get(name))

    for prefix in (ENGINES_V1, BACKEND_V1):  # `/v1/models`: the alias
        router.add_api_route(prefix + "/models", list_models, methods=["GET"])
        router.add_api_route(prefix + "/models/{name:path}", get_model, methods=["GET"])
    return router
