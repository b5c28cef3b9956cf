"""OpenAI-style inference routes, served as raw ASGI in front of the FastAPI app.

`/engines[/{backend}]/v1/{chat/completions,completions,embeddings,images/generations}`,
`/engines[/{backend}]/{rerank,score}` and the `/v1/...`, `/rerank`, `/score` aliases: read the body once,
take only its `model` field, get a runner from the scheduler and relay the bytes (server/proxy.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from modelrunner.engines.base import Engine, Mode, ModelForEngine
from modelrunner.errors import (
    BadRequest,
    EngineNotInstalled,
    MethodNotAllowed,
    ModelNotFound,
    ModelRunnerError,
)
from modelrunner.scheduler.durations import parse_keep_alive
from modelrunner.scheduler.runner import Runner
from modelrunner.scheduler.scheduler import Busy, Scheduler
from modelrunner.server.errors import error_body
from modelrunner.server.proxy import Receive, Scope, Send, relay, send_json
from modelrunner.store.store import ModelStore, StoredModel

MAX_BODY = 10 * 1024 * 1024
KNOWN_BACKENDS = ("llama.cpp", "vllm", "mlx", "sglang", "diffusers")
DEFAULT_BACKEND = "llama.cpp"
_OPERATIONS = (
    # Anthropic `v1/messages` is served by server/anthropic_api.py (its own error shape)
    r"v1/(?:chat/completions|completions|embeddings|rerank|score|images/generations)|rerank|score"
)
_ROUTE = re.compile(rf"/(?:engines/(?:(?P<backend>[^/]+)/)?)?(?P<op>{_OPERATIONS})")
_MODES = {
    "embeddings": Mode.EMBEDDING,
    "rerank": Mode.RERANKING,
    "score": Mode.RERANKING,
    "generations": Mode.IMAGE_GENERATION,
}


class BodyTooLarge(ModelRunnerError):
    status_code = 413


@dataclass(frozen=True)
class Route:
    backend: str | None
    upstream_path: str  # starts at /v1/, /rerank or /score, as the engine expects
    mode: Mode


def match_route(path: str) -> Route | None:
    match = _ROUTE.fullmatch(path)
    if match is None:
        return None
    backend, op = match.group("backend"), match.group("op")
    if backend == "v1":  # /engines/v1/rerank: "v1" is the API version, not a backend
        backend, op = None, "v1/" + op
    return Route(backend, "/" + op, _MODES.get(op.rsplit("/", 1)[-1], Mode.COMPLETION))


def select_engine_name(requested: str | None, model_format: str) -> str:
    """The model's format decides, whatever the URL says (DMR's selectBackendForModel)."""
    if model_format == "safetensors":
        return "vllm"
    if model_format in ("dduf", "diffusers"):
        return "diffusers"
    return requested if requested and requested not in ("vllm", "diffusers") else DEFAULT_BACKEND


def model_for_engine(store: ModelStore, model: StoredModel, requested_as: str) -> ModelForEngine:
    return ModelForEngine(
        id=model.id,
        reference=requested_as,
        bundle=store.bundle_of(model),
        format=model.config.format,
        context_size=model.config.context_size,
        size_bytes=sum(layer.size for layer in model.manifest.layers),
    )


async def read_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("the client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is larger than {limit // (1024 * 1024)} MiB")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


class InferenceHandler:
    def __init__(self, store: ModelStore, scheduler: Scheduler, engines: Mapping[str, Engine]) -> None:
        self.store = store
        self.scheduler = scheduler
        self.engines = engines

    def _engine(self, route: Route, model: StoredModel) -> Engine:
        if route.backend is not None and route.backend not in KNOWN_BACKENDS:
            raise ModelNotFound(f"unknown backend {route.backend[:40]!r}; known: {', '.join(KNOWN_BACKENDS)}")
        name = select_engine_name(route.backend, model.config.format)
        engine = self.engines.get(name)
        if engine is None:
            raise EngineNotInstalled(f"the {name} engine is not available in this build of modelrunner")
        return engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send, route: Route) -> None:
        try:
            await self._handle(scope, receive, send, route)
        except ModelRunnerError as exc:
            status, body, headers = error_parts(exc)
            await send_json(send, status, body, headers)

    async def prepare(self, route: Route, body: bytes) -> tuple[Runner, bytes]:
        """A runner for the request's model, acquired (the caller releases it), and the body to send it."""
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply
            raise BadRequest("the request body is not valid JSON") from None
        name = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise BadRequest("the request has no model field")
        keep_alive = parse_keep_alive(doc["keep_alive"]) if "keep_alive" in doc else None
        model = self.store.get(name)
        engine = self._engine(route, model)
        if not self.scheduler.has_runner(engine.name, model.id, route.mode):
            engine.require_installed()
        runner = await self.scheduler.acquire(
            engine, model_for_engine(self.store, model, name), route.mode, keep_alive
        )
        if runner.model.reference != name:
            # Engines such as vLLM answer only to the names they were started with: another name of the
            # same model (a tag, the short form) is sent as the runner's.
            body = json.dumps({**doc, "model": runner.model.reference}).encode()
        return runner, body

    async def _handle(self, scope: Scope, receive: Receive, send: Send, route: Route) -> None:
        if scope["method"] != "POST":
            raise MethodNotAllowed("use POST for this route")
        runner, body = await self.prepare(route, await read_body(receive, MAX_BODY))
        try:
            if _header(scope, b"x-preload-only") == b"true":
                await send(
                    {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
                )
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await relay(scope, receive, send, runner.socket, route.upstream_path, body)
        finally:
            await self.scheduler.release(runner)


def error_parts(exc: ModelRunnerError) -> tuple[int, dict[str, object], list[tuple[bytes, bytes]]]:
    """Status, JSON body and extra headers of the answer to a refused inference request."""
    headers: list[tuple[bytes, bytes]] = []
    if isinstance(exc, Busy):
        headers.append((b"retry-after", str(exc.retry_after).encode()))
    elif isinstance(exc, MethodNotAllowed):
        headers.append((b"allow", b"POST"))
    return exc.status_code, error_body(exc.status_code, exc.message), headers


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).lower()
    return None
