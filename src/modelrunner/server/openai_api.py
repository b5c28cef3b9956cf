"""OpenAI model listing: `/engines[/{backend}]/v1/models[/{name}]` (and `/v1/models` through the alias)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from modelrunner.store.store import ModelStore, StoredModel


def openai_id(model: StoredModel) -> str:
    """The first tag as stored (`docker.io/ai/m:latest`), else the ID, as DMR's ToOpenAI; usable as
    `model` in requests, which normalise names."""
    return model.tags[0] if model.tags else model.id


def openai_model(model: StoredModel) -> dict[str, Any]:
    config = model.config.config
    return {
        "id": openai_id(model),
        "object": "model",
        "created": model.config.created,
        "owned_by": "docker",
        "dmr": {
            "context_window": model.config.context_size,
            "architecture": config.get("architecture", ""),
            "parameters": config.get("parameters", ""),
            "quantization": config.get("quantization", ""),
            "size": config.get("size", ""),
        },
    }


def build_openai_router(store: ModelStore) -> APIRouter:
    router = APIRouter()

    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [openai_model(m) for m in store.list_models()]}

    def get_model(name: str) -> dict[str, Any]:
        return openai_model(store.get(name))

    for prefix in ("/engines/v1", "/engines/{backend}/v1"):
        router.add_api_route(prefix + "/models", list_models, methods=["GET"])
        router.add_api_route(prefix + "/models/{name:path}", get_model, methods=["GET"])
    return router
