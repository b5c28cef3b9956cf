"""Ollama's API under `/api` (contract 2.2), translated to the engines' OpenAI API.

Beyond DMR: `/api/push`, `/api/copy`, `/api/embed` and `/api/embeddings`. `think` is sent per request
(`chat_template_kwargs.enable_thinking`) rather than as a runner setting, so it never forces a reload;
`num_ctx` is a persisted per-model setting (it needs a reload); `keep_alive` applies to the runner that
answers, like the OpenAI routes' `keep_alive` extension. Errors are Ollama's `{"error": "..."}`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio.to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from modelrunner.compat import ollama as shapes
from modelrunner.compat.bodies import parse_json_object, validated
from modelrunner.distribution.jobs import TransferJob, TransferManager
from modelrunner.engines.base import Mode
from modelrunner.errors import ModelNotFound, ModelRunnerError
from modelrunner.scheduler.durations import NEVER, parse_keep_alive
from modelrunner.scheduler.settings import ModelSettings
from modelrunner.server.distribution_api import wait_started
from modelrunner.server.lifecycle import Inference
from modelrunner.server.upstream import EngineCall, call_engine
from modelrunner.store.store import StoredModel

OLLAMA_VERSION = "0.1.0"  # what DMR answers
NDJSON = "application/x-ndjson"
_FOREVER = datetime(9999, 12, 31, tzinfo=UTC).isoformat().replace("+00:00", "Z")

Shape = TypeVar("Shape", bound=BaseModel)


def ollama_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def parse(request: Request, shape: type[Shape]) -> Shape:
    return validated(shape, parse_json_object(await request.body()))


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode() + b"\n"


def build_ollama_router(ctx: Inference, transfers: TransferManager) -> APIRouter:
    """Errors are Ollama's `{"error": "..."}`: server/errors.py shapes them by path."""
    router = APIRouter(prefix="/api")

    def lookup(name: str) -> StoredModel:
        try:
            return ctx.store.get(name)
        except ModelNotFound:
            raise ModelNotFound(f"model '{name[:200]}' not found") from None

    async def apply_context_size(name: str, num_ctx: int | None, mode: Mode) -> None:
        """`options.num_ctx` becomes the model's persisted context size; idle runners reload with it."""
        if num_ctx is None:
            return
        model = lookup(name)
        engine = ctx.engine_for(model)
        settings = ctx.scheduler.settings.get(engine.name, model.id, mode) or ModelSettings()
        if settings.context_size == num_ctx:
            return
        settings.context_size = num_ctx
        ctx.scheduler.settings.put(engine.name, model.id, mode, settings)
        await ctx.scheduler.unload({model.id}, engine.name)  # a runner in use keeps its size until idle

    async def load_or_unload(name: str, keep_alive: float | None, kind: str) -> dict[str, Any]:
        """An empty chat or prompt loads the model; with keep_alive 0 it unloads it (Ollama's idiom)."""
        model = lookup(name)
        if keep_alive == 0:
            await ctx.scheduler.unload({model.id})
            reason = "unload"
        else:
            runner = await ctx.acquire(name, Mode.COMPLETION, keep_alive, record=False)
            await ctx.release(runner)
            reason = "load"
        answer: dict[str, Any] = {"model": name, "created_at": shapes.now_text()}
        if kind == "chat":
            answer["message"] = {"role": "assistant", "content": ""}
        else:
            answer["response"] = ""
        return answer | {"done": True, "done_reason": reason}

    async def complete(
        kind: str, name: str, path: str, body: dict[str, Any], keep_alive: float | None, stream: bool
    ) -> Response:
        started = time.monotonic()
        call = await call_engine(ctx, name, path, body, Mode.COMPLETION, keep_alive)
        if stream:
            return StreamingResponse(_stream(kind, name, call, started), media_type=NDJSON)
        try:
            answer = await call.json()
        finally:
            await call.close()
        choice = (answer.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        text = message.get("content") or choice.get("text") or ""
        thinking = message.get("reasoning_content")
        out: dict[str, Any] = {"model": name, "created_at": shapes.now_text()}
        if kind == "chat":
            out["message"] = {"role": "assistant", "content": text}
            if thinking:
                out["message"]["thinking"] = thinking
            if message.get("tool_calls"):
                out["message"]["tool_calls"] = shapes.ollama_tool_calls(message["tool_calls"])
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out |= {"done": True, "done_reason": shapes.done_reason(choice.get("finish_reason"))}
        return JSONResponse(
            out | shapes.final_fields(answer.get("usage"), answer.get("timings"), started, call.load_seconds)
        )

    async def _stream(kind: str, name: str, call: EngineCall, started: float) -> AsyncIterator[bytes]:
        def piece(text: str, thinking: str, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
            out: dict[str, Any] = {"model": name, "created_at": shapes.now_text()}
            if kind == "chat":
                out["message"] = {"role": "assistant", "content": text}
                if thinking:
                    out["message"]["thinking"] = thinking
                if tool_calls:
                    out["message"]["tool_calls"] = tool_calls
            else:
                out["response"] = text
                if thinking:
                    out["thinking"] = thinking
            return out | {"done": False}

        calls = shapes.ToolCallAccumulator()
        finish: str | None = None
        usage: dict[str, Any] | None = None
        timings: dict[str, Any] | None = None
        try:
            async for chunk in call.events():
                if chunk.get("usage"):
                    usage, timings = chunk["usage"], chunk.get("timings")
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    calls.add(delta.get("tool_calls"))
                    text = delta.get("content") or choice.get("text") or ""
                    thinking = delta.get("reasoning_content") or ""
                    if text or thinking:
                        yield _line(piece(text, thinking, None))
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                        if calls.calls:
                            yield _line(piece("", "", calls.take()))
            last = piece("", "", None) | {"done": True, "done_reason": shapes.done_reason(finish)}
            yield _line(last | shapes.final_fields(usage, timings, started, call.load_seconds))
        except ModelRunnerError as exc:
            yield _line({"error": exc.message})
        finally:
            await call.close()

    def keep_alive_of(value: str | int | float | None) -> float | None:
        return None if value is None else parse_keep_alive(value)

    # -- routes ----------------------------------------------------------------------------------

    @router.get("/version")
    def version() -> dict[str, str]:
        return {"version": OLLAMA_VERSION}

    @router.get("/tags")
    def tags() -> dict[str, Any]:
        return {
            "models": [
                shapes.tags_entry(m, shapes.ollama_name(tag) if m.tags else tag)
                for m in ctx.store.list_models()
                for tag in (m.tags or [m.id])
            ]
        }

    @router.get("/ps")
    def ps() -> dict[str, Any]:
        out = []
        now = time.time()
        for runner in ctx.scheduler.ps():
            if runner["mode"] not in (Mode.COMPLETION.value, Mode.EMBEDDING.value):
                continue
            try:
                model = ctx.store.get(runner["model_id"])
            except ModelNotFound:
                continue
            keep = parse_keep_alive(runner["keep_alive"])
            if keep == NEVER:
                expires = _FOREVER
            else:
                expires = shapes.timestamp_text((now if runner["in_use"] else runner["last_used"]) + keep)
            out.append(
                shapes.tags_entry(model, shapes.ollama_name(runner["model_name"]))
                | {
                    "expires_at": expires,
                    "size": runner["memory_estimate"],
                    "size_vram": 0,
                    "context_length": model.config.context_size,
                }
            )
        return {"models": out}

    @router.post("/show")
    async def show(request: Request) -> dict[str, Any]:
        body = await parse(request, shapes.PullRequest)
        return shapes.show_response(lookup(body.model_name()))

    @router.post("/chat")
    async def chat(request: Request) -> Response:
        body = await parse(request, shapes.ChatRequest)
        name, keep_alive = body.model_name(), keep_alive_of(body.keep_alive)
        if not body.messages:
            return JSONResponse(await load_or_unload(name, keep_alive, "chat"))
        await apply_context_size(name, shapes.context_size_option(body.options), Mode.COMPLETION)
        return await complete(
            "chat", name, "/v1/chat/completions", shapes.chat_body(body), keep_alive, body.stream
        )

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        body = await parse(request, shapes.GenerateRequest)
        name, keep_alive = body.model_name(), keep_alive_of(body.keep_alive)
        if not body.prompt and not body.images:
            return JSONResponse(await load_or_unload(name, keep_alive, "generate"))
        await apply_context_size(name, shapes.context_size_option(body.options), Mode.COMPLETION)
        path, upstream = shapes.generate_body(body)
        return await complete("generate", name, path, upstream, keep_alive, body.stream)

    async def embeddings_of(
        name: str, inputs: list[str], options: dict[str, Any] | None, keep_alive: float | None
    ) -> tuple[list[list[float]], dict[str, Any], float, float]:
        await apply_context_size(name, shapes.context_size_option(options), Mode.EMBEDDING)
        started = time.monotonic()
        call = await call_engine(
            ctx, name, "/v1/embeddings", {"model": name, "input": inputs}, Mode.EMBEDDING, keep_alive
        )
        try:
            answer = await call.json()
        finally:
            await call.close()
        data = sorted(answer.get("data") or [], key=lambda item: item.get("index", 0))
        return (
            [item.get("embedding") or [] for item in data],
            answer.get("usage") or {},
            started,
            call.load_seconds,
        )

    @router.post("/embed")
    async def embed(request: Request) -> dict[str, Any]:
        body = await parse(request, shapes.EmbedRequest)
        name = body.model_name()
        vectors, usage, started, load_seconds = await embeddings_of(
            name, shapes.embed_inputs(body), body.options, keep_alive_of(body.keep_alive)
        )
        if body.dimensions:
            vectors = [v[: body.dimensions] for v in vectors]
        timing = shapes.final_fields(usage, None, started, load_seconds)
        return {
            "model": name,
            "embeddings": vectors,
            "total_duration": timing["total_duration"],
            "load_duration": timing["load_duration"],
            "prompt_eval_count": timing["prompt_eval_count"],
        }

    @router.post("/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        body = await parse(request, shapes.EmbeddingsRequest)
        vectors, *_ = await embeddings_of(
            body.model_name(), [body.prompt], body.options, keep_alive_of(body.keep_alive)
        )
        return {"embedding": vectors[0] if vectors else []}

    @router.delete("/delete")
    async def delete(request: Request) -> Response:
        body = await parse(request, shapes.PullRequest)
        name = body.model_name()
        model = lookup(name)
        await ctx.scheduler.unload({model.id})
        await anyio.to_thread.run_sync(ctx.store.delete, name)
        return Response(status_code=200)

    @router.post("/copy")
    async def copy(request: Request) -> Response:
        body = await parse(request, shapes.CopyRequest)
        lookup(body.source)
        await anyio.to_thread.run_sync(ctx.store.tag, body.source, body.destination)
        return Response(status_code=200)

    async def transfer(job: TransferJob, stream: bool, first: str) -> Response:
        await wait_started(job)
        if stream:
            return StreamingResponse(_progress(job, first), media_type=NDJSON)
        last: dict[str, Any] = {}
        async for line in _progress(job, first):
            last = json.loads(line)
        if "error" in last:
            return ollama_error(500, str(last["error"]))
        return JSONResponse(last)

    async def _progress(job: TransferJob, first: str) -> AsyncIterator[bytes]:
        yield _line({"status": first})
        index = 0
        try:
            while True:
                events, finished = await anyio.to_thread.run_sync(job.next_events, index, 0.5)
                index += len(events)
                for event in events:
                    yield _line(shapes.progress_status(event))
                if finished:
                    return
        finally:
            job.detach()

    @router.post("/pull")
    async def pull(request: Request) -> Response:
        body = await parse(request, shapes.PullRequest)
        job = await anyio.to_thread.run_sync(transfers.start_pull, body.model_name())
        return await transfer(job, body.stream, "pulling manifest")

    @router.post("/push")
    async def push(request: Request) -> Response:
        body = await parse(request, shapes.PullRequest)
        name = body.model_name()
        lookup(name)
        job = await anyio.to_thread.run_sync(transfers.start_push, name)
        return await transfer(job, body.stream, "retrieving manifest")

    return router
