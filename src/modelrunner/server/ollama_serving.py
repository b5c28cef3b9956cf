"""What the Ollama API (`/api`, contract 2.2) does, without HTTP: each method takes a validated request
(compat/ollama.py's shapes) and returns Ollama's answer, a JSON document or an NDJSON stream, or raises
the ModelRunnerError that server/errors.py answers as Ollama's `{"error": "..."}`. server/ollama_api.py
is the router that parses, calls and shapes.

Beyond DMR: `/api/push`, `/api/copy`, `/api/embed` and `/api/embeddings`. `think` is sent per request
(`chat_template_kwargs.enable_thinking`) rather than as a runner setting, so it never forces a reload;
`num_ctx` is a persisted per-model setting (it needs a reload); `keep_alive` applies to the runner that
answers, like the OpenAI routes' `keep_alive` extension.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import anyio.to_thread

from modelrunner.compat import embeddings
from modelrunner.compat import ollama as shapes
from modelrunner.engines.base import Mode
from modelrunner.errors import BadRequest, ModelNotFound, ModelRunnerError
from modelrunner.scheduler.durations import NEVER, parse_keep_alive
from modelrunner.scheduler.settings import ModelSettings
from modelrunner.server import embed_truncation, keepalive
from modelrunner.server.distribution_api import wait_started
from modelrunner.server.engine_request import call_engine
from modelrunner.server.lifecycle import Inference
from modelrunner.server.ollama_persona import Personas
from modelrunner.server.served_call import InputTooLong, ServedCall
from modelrunner.server.serving import Document, LineStream
from modelrunner.server.transfers import TransferJob, TransferManager
from modelrunner.store.store import StoredModel

OLLAMA_VERSION = "0.1.0"  # what DMR answers
_FOREVER = datetime(9999, 12, 31, tzinfo=UTC).isoformat().replace("+00:00", "Z")

Kind = Literal["chat", "generate"]
Request = TypeVar("Request", shapes.ChatRequest, shapes.GenerateRequest)


def _line(doc: Document) -> bytes:
    return json.dumps(doc).encode() + b"\n"


def keep_alive_of(value: str | int | float | None) -> float | None:
    return None if value is None else parse_keep_alive(value)


class OllamaServing:
    """The Ollama API over the daemon's inference (runners on the current exchange) and transfers."""

    def __init__(self, ctx: Inference, transfers: TransferManager) -> None:
        self.ctx = ctx
        self.transfers = transfers
        self.personas = Personas(ctx.store)  # what `/api/create` kept with a tag (system, parameters)

    # -- models ------------------------------------------------------------------------------------

    def version(self) -> dict[str, str]:
        return {"version": OLLAMA_VERSION}

    def tags(self) -> Document:
        return {
            "models": [
                shapes.tags_entry(m, shapes.ollama_name(tag) if m.tags else tag)
                for m in self.ctx.store.list_models()
                for tag in (m.tags or [m.id])
            ]
        }

    def ps(self) -> Document:
        """The models in memory, once each as Ollama lists them: a model with a chat and an embedding
        runner is one entry, their sizes added, in memory until the last of them expires."""
        out: dict[str, Document] = {}
        until: dict[str, float] = {}
        now = time.time()
        for runner in self.ctx.scheduler.ps():
            if runner["mode"] not in (Mode.COMPLETION.value, Mode.EMBEDDING.value):
                continue
            try:
                model = self.ctx.store.get(runner["model_id"])
            except ModelNotFound:
                continue
            keep = parse_keep_alive(runner["keep_alive"])
            expires = (now if runner["in_use"] else runner["last_used"]) + keep  # NEVER stays NEVER
            if model.id in out:
                out[model.id]["size"] += runner["memory_estimate"]
                until[model.id] = max(until[model.id], expires)
                continue
            until[model.id] = expires
            out[model.id] = shapes.tags_entry(model, shapes.ollama_name(runner["model_name"])) | {
                "expires_at": "",
                "size": runner["memory_estimate"],
                "size_vram": 0,
                "context_length": model.config.context_size,
            }
        for model_id, entry in out.items():
            expires = until[model_id]
            entry["expires_at"] = _FOREVER if expires == NEVER else shapes.timestamp_text(expires)
        return {"models": list(out.values())}

    def show(self, body: shapes.PullRequest) -> Document:
        """Ollama's answer, its capabilities with what the model allows (`tools`, `vision`, `thinking`) as
        its engine says (`Engine.capabilities`, decided as its request check decides): what `model launch`
        asks before starting a coding agent, and clients before they send tools or images."""
        model = self.lookup(body.model_name())
        persona = self.personas.of(body.model_name(), model)
        shown = shapes.show_response(model, persona.system, persona.parameters)
        engine = self.ctx.engine_for(model)
        shown["capabilities"] += engine.capabilities(model.config, self.ctx.store.bundle_of(model))
        return shown

    async def delete(self, body: shapes.PullRequest) -> None:
        name = body.model_name()
        model = self.lookup(name)
        await self.ctx.scheduler.unload({model.id})
        await anyio.to_thread.run_sync(self.ctx.store.delete, name)
        self.personas.forget(name)

    async def copy(self, body: shapes.CopyRequest) -> None:
        model = self.lookup(body.source)
        await anyio.to_thread.run_sync(self.ctx.store.tag, body.source, body.destination)
        self.personas.copy(body.source, body.destination, model)

    def lookup(self, name: str) -> StoredModel:
        try:
            return self.ctx.store.get(name)
        except ModelNotFound:
            raise ModelNotFound(f"model '{name[:200]}' not found") from None

    # -- generation --------------------------------------------------------------------------------

    async def chat(self, body: shapes.ChatRequest) -> Document | LineStream:
        name, keep_alive = body.model_name(), keep_alive_of(body.keep_alive)
        if not body.messages:
            return await self.load_or_unload(name, keep_alive, "chat")
        body = self.with_persona(body)
        await self.apply_context_size(name, shapes.context_size_option(body.options), Mode.COMPLETION)
        return await self._complete(
            "chat", name, "/v1/chat/completions", shapes.chat_body(body), keep_alive, body.stream
        )

    async def generate(self, body: shapes.GenerateRequest) -> Document | LineStream:
        name, keep_alive = body.model_name(), keep_alive_of(body.keep_alive)
        if not body.prompt and not body.images:
            return await self.load_or_unload(name, keep_alive, "generate")
        body = self.with_persona(body)
        await self.apply_context_size(name, shapes.context_size_option(body.options), Mode.COMPLETION)
        path, upstream = shapes.generate_body(body)
        return await self._complete("generate", name, path, upstream, keep_alive, body.stream)

    def with_persona(self, body: Request) -> Request:
        """The request with the system prompt and parameters its model was created with, if any."""
        if not self.personas.path.exists():  # most stores: no model was created with one
            return body
        name = body.model_name()
        persona = self.personas.of(name, self.lookup(name))
        return shapes.with_persona(body, persona.system, persona.parameters) if persona else body

    async def apply_context_size(self, name: str, num_ctx: int | None, mode: Mode) -> None:
        """`options.num_ctx` becomes the model's persisted context size; idle runners reload with it."""
        if num_ctx is None:
            return
        model = self.lookup(name)
        engine = self.ctx.engine_for(model)
        settings = self.ctx.scheduler.settings.get(engine.name, model.id, mode) or ModelSettings()
        if settings.context_size == num_ctx:
            return
        settings.context_size = num_ctx
        self.ctx.scheduler.settings.put(engine.name, model.id, mode, settings)
        await self.ctx.scheduler.unload({model.id}, engine.name)  # a runner in use keeps its size until idle

    async def load_or_unload(self, name: str, keep_alive: float | None, kind: Kind) -> Document:
        """An empty chat or prompt loads the model; with keep_alive 0 it unloads it (Ollama's idiom)."""
        model = self.lookup(name)
        if keep_alive == 0:
            await self.ctx.scheduler.unload({model.id})
            reason = "unload"
        else:
            runner = await self.ctx.acquire(name, Mode.COMPLETION, keep_alive, record=False)
            await self.ctx.release(runner)
            reason = "load"
        answer: Document = {"model": name, "created_at": shapes.now_text()}
        if kind == "chat":
            answer["message"] = {"role": "assistant", "content": ""}
        else:
            answer["response"] = ""
        return answer | {"done": True, "done_reason": reason}

    async def _complete(
        self, kind: Kind, name: str, path: str, body: Document, keep_alive: float | None, stream: bool
    ) -> Document | LineStream:
        started = time.monotonic()
        start = call_engine(self.ctx, name, path, body, Mode.COMPLETION, keep_alive)
        if stream:
            return await _streamed(kind, name, start, started)
        call = await start
        try:
            answer = await call.json()
        finally:
            await call.close()
        choice = (answer.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        text = message.get("content") or choice.get("text") or ""
        thinking = message.get("reasoning_content")
        out: Document = {"model": name, "created_at": shapes.now_text()}
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
        return out | shapes.final_fields(
            answer.get("usage"), answer.get("timings"), started, call.engine.load_seconds
        )

    # -- embeddings --------------------------------------------------------------------------------

    async def embed(self, body: shapes.EmbedRequest) -> Document:
        """Ollama's EmbedHandler: an input too long for the model loses its end unless `truncate` is false;
        each vector is L2-normalised, and shortened then normalised again when `dimensions` asks."""
        name, keep_alive = body.model_name(), keep_alive_of(body.keep_alive)
        inputs: list[str] | list[list[int]] = shapes.embed_inputs(body)
        started = time.monotonic()
        try:
            vectors, usage, _, load_seconds = await self._embeddings_of(
                name, inputs, body.options, keep_alive
            )
        except InputTooLong as exc:
            if body.truncate is False:
                raise BadRequest(embed_truncation.EXCEEDS_CONTEXT) from None
            inputs = await embed_truncation.fitted(
                self.ctx, name, shapes.embed_inputs(body), exc.limit, keep_alive
            )
            vectors, usage, _, load_seconds = await self._embeddings_of(
                name, inputs, body.options, keep_alive
            )
        vectors = [embeddings.normalised(v) for v in vectors]
        if body.dimensions:
            vectors = [embeddings.shortened(v, body.dimensions) for v in vectors]
        timing = shapes.final_fields(usage, None, started, load_seconds)
        return {
            "model": name,
            "embeddings": vectors,
            "total_duration": timing["total_duration"],
            "load_duration": timing["load_duration"],
            "prompt_eval_count": timing["prompt_eval_count"],
        }

    async def embeddings(self, body: shapes.EmbeddingsRequest) -> Document:
        vectors, *_ = await self._embeddings_of(
            body.model_name(), [body.prompt], body.options, keep_alive_of(body.keep_alive)
        )
        return {"embedding": vectors[0] if vectors else []}

    async def _embeddings_of(
        self,
        name: str,
        inputs: list[str] | list[list[int]],
        options: Document | None,
        keep_alive: float | None,
    ) -> tuple[list[list[float]], Document, float, float]:
        await self.apply_context_size(name, shapes.context_size_option(options), Mode.EMBEDDING)
        started = time.monotonic()
        call = await call_engine(
            self.ctx, name, "/v1/embeddings", {"model": name, "input": inputs}, Mode.EMBEDDING, keep_alive
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
            call.engine.load_seconds,
        )

    # -- transfers ---------------------------------------------------------------------------------

    async def pull(self, body: shapes.PullRequest) -> Document | LineStream:
        job = await anyio.to_thread.run_sync(self.transfers.start_pull, body.model_name())
        return await _transfer(job, body.stream, "pulling manifest")

    async def push(self, body: shapes.PullRequest) -> Document | LineStream:
        name = body.model_name()
        self.lookup(name)
        job = await anyio.to_thread.run_sync(self.transfers.start_push, name)
        return await _transfer(job, body.stream, "retrieving manifest")


def _piece(kind: Kind, name: str, text: str, thinking: str, tool_calls: list[Document] | None) -> Document:
    """A line of an answer in the making, as Ollama streams it."""
    out: Document = {"model": name, "created_at": shapes.now_text()}
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


async def _streamed(
    kind: Kind, name: str, start: Coroutine[Any, Any, ServedCall], started: float
) -> LineStream:
    """The stream of a started engine call, with a keep-alive line while the engine is silent (its model
    loading, a prefill: server/keepalive.py): a piece with no text, which Ollama's clients add to the
    answer as nothing (an empty line would fail the `ollama` client's JSON parse)."""
    every = keepalive.interval()
    begun = await keepalive.within(start, every, ServedCall.close)
    ping = _line(_piece(kind, name, "", "", None))

    def lines(call: ServedCall) -> AsyncIterator[bytes]:
        return _stream(kind, name, call, started)

    def failed(exc: ModelRunnerError) -> bytes:
        return _line({"error": exc.message})

    ended = keepalive.line_ended
    if isinstance(begun, asyncio.Task):  # the stream's head goes out now, pings while it waits
        return LineStream(keepalive.waiting(begun, lines, ping, every, failed, ServedCall.close, ended))
    return LineStream(keepalive.pinged(lines(begun), ping, every, ended))


async def _stream(kind: Kind, name: str, call: ServedCall, started: float) -> AsyncIterator[bytes]:
    """The engine's chat-completion chunks as Ollama's NDJSON lines; an engine that fails mid-stream
    ends it with an `{"error": ...}` line (the status is sent already)."""

    def piece(text: str, thinking: str, tool_calls: list[Document] | None) -> Document:
        return _piece(kind, name, text, thinking, tool_calls)

    calls = shapes.ToolCallAccumulator()
    finish: str | None = None
    usage: Document | None = None
    timings: Document | None = None
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
        yield _line(last | shapes.final_fields(usage, timings, started, call.engine.load_seconds))
    except ModelRunnerError as exc:
        yield _line({"error": exc.message})
    finally:
        await call.close()


async def _transfer(job: TransferJob, stream: bool, first: str) -> Document | LineStream:
    """A pull or push once started: its progress as a stream, or its last status (a failure, a 500)."""
    await wait_started(job)
    if stream:
        return LineStream(_progress(job, first))
    last: Document = {}
    async for line in _progress(job, first):
        last = json.loads(line)
    if "error" in last:
        raise ModelRunnerError(str(last["error"]))  # a 500, answered in Ollama's shape
    return last


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
