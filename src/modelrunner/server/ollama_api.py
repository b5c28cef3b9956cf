"""Ollama's API under `/api` (contract 2.2): the router. It parses each body into its shape, calls
server/ollama_serving.py, which does the work, and answers its documents as JSON and its streams as
NDJSON. Errors are Ollama's `{"error": "..."}`: server/errors.py shapes them by path.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response

from modelrunner.compat import ollama as shapes
from modelrunner.compat.bodies import json_body
from modelrunner.server.lifecycle import Inference
from modelrunner.server.ollama_serving import OllamaServing
from modelrunner.server.routes import OLLAMA_PREFIX
from modelrunner.server.serving import respond
from modelrunner.server.transfers import TransferManager


def build_ollama_router(ctx: Inference, transfers: TransferManager) -> APIRouter:
    serving = OllamaServing(ctx, transfers)
    router = APIRouter(prefix=OLLAMA_PREFIX)

    @router.get("/version")
    def version() -> dict[str, str]:
        return serving.version()

    @router.get("/tags")
    def tags() -> dict[str, Any]:
        return serving.tags()

    @router.get("/ps")
    def ps() -> dict[str, Any]:
        return serving.ps()

    @router.post("/show")
    async def show(body: shapes.PullRequest = Depends(json_body(shapes.PullRequest))) -> dict[str, Any]:
        return serving.show(body)

    @router.post("/chat")
    async def chat(body: shapes.ChatRequest = Depends(json_body(shapes.ChatRequest))) -> Response:
        return respond(await serving.chat(body))

    @router.post("/generate")
    async def generate(
        body: shapes.GenerateRequest = Depends(json_body(shapes.GenerateRequest)),
    ) -> Response:
        return respond(await serving.generate(body))

    @router.post("/embed")
    async def embed(body: shapes.EmbedRequest = Depends(json_body(shapes.EmbedRequest))) -> dict[str, Any]:
        return await serving.embed(body)

    @router.post("/embeddings")
    async def embeddings(
        body: shapes.EmbeddingsRequest = Depends(json_body(shapes.EmbeddingsRequest)),
    ) -> dict[str, Any]:
        return await serving.embeddings(body)

    @router.delete("/delete")
    async def delete(body: shapes.PullRequest = Depends(json_body(shapes.PullRequest))) -> Response:
        await serving.delete(body)
        return Response(status_code=200)

    @router.post("/copy")
    async def copy(body: shapes.CopyRequest = Depends(json_body(shapes.CopyRequest))) -> Response:
        await serving.copy(body)
        return Response(status_code=200)

    @router.post("/pull")
    async def pull(body: shapes.PullRequest = Depends(json_body(shapes.PullRequest))) -> Response:
        return respond(await serving.pull(body))

    @router.post("/push")
    async def push(body: shapes.PullRequest = Depends(json_body(shapes.PullRequest))) -> Response:
        return respond(await serving.push(body))

    return router
