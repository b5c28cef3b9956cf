"""Scheduler and observability routes: /engines/ps, /engines/unload, /engines/_configure, /logs, /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from modelrunner.engines.base import Engine, InstallState, Mode
from modelrunner.errors import BadRequest, Conflict, ModelNotFound
from modelrunner.scheduler.durations import format_keep_alive, parse_keep_alive
from modelrunner.scheduler.runner import RunnerState
from modelrunner.scheduler.scheduler import Scheduler
from modelrunner.scheduler.settings import ModelSettings
from modelrunner.server.lifecycle import KNOWN_BACKENDS, model_for_engine, select_engine_name
from modelrunner.store.store import ModelStore

_HF_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UnloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    all: bool = False
    backend: str | None = None
    models: list[str] = Field(default_factory=list, max_length=1000)


class ConfigureRequest(BaseModel):
    """DMR's _configure body (hyphenated keys as DMR's CLI sends them)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    model: str = Field(min_length=1)
    mode: Mode | None = None
    context_size: int | None = Field(default=None, alias="context-size")
    runtime_flags: list[str] | None = Field(default=None, alias="runtime-flags", max_length=200)
    raw_runtime_flags: str | None = Field(default=None, alias="raw-runtime-flags", max_length=10_000)
    keep_alive: str | int | float | None = None
    vllm: dict[str, Any] | None = None
    llamacpp: dict[str, Any] | None = None
    speculative: dict[str, Any] | None = None


def check_hf_overrides(value: Any, depth: int = 0) -> None:
    """Keys must be identifiers, recursively; values primitives, arrays or objects (contract 5.5)."""
    if depth > 16:
        raise BadRequest("hf_overrides is nested too deeply")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not _HF_KEY.fullmatch(key):
                raise BadRequest(f"invalid hf_overrides key {str(key)[:40]!r}")
            check_hf_overrides(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_hf_overrides(item, depth + 1)
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise BadRequest("hf_overrides values must be strings, numbers, booleans, arrays or objects")


def settings_from_request(
    body: ConfigureRequest, engine: Engine, base: ModelSettings | None, store: ModelStore
) -> ModelSettings:
    settings = base or ModelSettings()
    if body.context_size is not None:
        if body.context_size == 0 or body.context_size < -1 or body.context_size > 2**31 - 1:
            raise BadRequest(
                "context-size must be a positive number of tokens, or -1 for the model's maximum"
            )
        settings.context_size = body.context_size
    flags = list(body.runtime_flags or [])
    if body.raw_runtime_flags:
        try:
            flags += shlex.split(body.raw_runtime_flags)
        except ValueError as exc:
            raise BadRequest(f"invalid raw-runtime-flags: {exc}") from None
    if body.runtime_flags is not None or body.raw_runtime_flags is not None:
        engine.validate_runtime_flags(flags)
        settings.runtime_flags = flags
    if body.keep_alive is not None:
        settings.keep_alive = parse_keep_alive(body.keep_alive)
    if body.llamacpp and "reasoning-budget" in body.llamacpp:
        budget = body.llamacpp["reasoning-budget"]
        if not (_is_number(budget, int) and budget >= -1):
            raise BadRequest("reasoning-budget must be -1 (unlimited), 0 (off) or a number of tokens")
        settings.reasoning_budget = budget
    if body.vllm:
        overrides = body.vllm.get("hf-overrides")
        if overrides is not None:
            if not isinstance(overrides, dict):
                raise BadRequest("hf-overrides must be a JSON object")
            check_hf_overrides(overrides)
            settings.hf_overrides = overrides
        utilisation = body.vllm.get("gpu-memory-utilization")
        if utilisation is not None:
            if not (_is_number(utilisation, int | float) and 0 < utilisation <= 1):
                raise BadRequest("gpu-memory-utilization must be a number in (0, 1]")
            settings.gpu_memory_utilization = float(utilisation)
    if body.speculative is not None:
        speculative_settings(body.speculative, engine, store, settings)
    return settings


def _is_number(value: Any, kind: Any) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def speculative_settings(
    spec: dict[str, Any], engine: Engine, store: ModelStore, settings: ModelSettings
) -> None:
    """`speculative: {draft_model, num_tokens, min_acceptance_rate}` (DMR's shape); an empty draft_model
    turns speculative decoding off."""
    unknown = sorted(set(spec) - {"draft_model", "num_tokens", "min_acceptance_rate"})
    if unknown:
        raise BadRequest(
            f"unknown speculative setting {unknown[0][:40]!r}; known: draft_model, num_tokens, "
            "min_acceptance_rate"
        )
    draft = spec.get("draft_model")
    if draft is None or draft == "":
        if set(spec) - {"draft_model"}:
            raise BadRequest("speculative settings need a draft_model")
        settings.speculative_draft_model = None
        settings.speculative_num_tokens = settings.speculative_min_acceptance_rate = None
        return
    if not isinstance(draft, str):
        raise BadRequest("draft_model must be a model name")
    if engine.name != "llama.cpp":
        raise BadRequest("speculative decoding with a draft model is supported for llama.cpp (GGUF) models")
    try:
        model = store.get(draft)
    except ModelNotFound:
        raise ModelNotFound(f"draft model {draft[:200]} not found; pull or package it first") from None
    if model.config.format != "gguf":
        raise BadRequest(f"the draft model must be a GGUF model, and {draft[:200]} is {model.config.format}")
    tokens = spec.get("num_tokens")
    if tokens is not None and not (_is_number(tokens, int) and 1 <= tokens <= 128):
        raise BadRequest("num_tokens must be a number of tokens from 1 to 128")
    rate = spec.get("min_acceptance_rate")
    if rate is not None and not (_is_number(rate, int | float) and 0 <= rate <= 1):
        raise BadRequest("min_acceptance_rate must be a number from 0 to 1")
    settings.speculative_draft_model = model.id
    settings.speculative_num_tokens = tokens
    settings.speculative_min_acceptance_rate = None if rate is None else float(rate)


def build_admin_router(
    store: ModelStore, scheduler: Scheduler, engines: Mapping[str, Engine], logs_dir: Path
) -> APIRouter:
    router = APIRouter()

    @router.get("/engines/ps")
    def ps() -> list[dict[str, Any]]:
        return scheduler.ps()

    @router.post("/engines/unload")
    async def unload(body: UnloadRequest) -> dict[str, int]:
        if not body.all and not body.models:
            raise BadRequest("name the models to unload, or set all")
        ids: set[str] | None = None
        if not body.all:
            ids = set()
            for name in body.models:
                with contextlib.suppress(ModelNotFound):
                    ids.add(store.get(name).id)
        return {"unloaded_runners": await scheduler.unload(ids, body.backend)}

    async def configure(body: ConfigureRequest, backend: str | None) -> PlainTextResponse:
        if backend is not None and backend not in KNOWN_BACKENDS:
            raise ModelNotFound(f"unknown backend {backend[:40]!r}")
        model = store.get(body.model)
        engine_name = select_engine_name(backend, model.config.format)
        engine = engines.get(engine_name)
        if engine is None:
            raise ModelNotFound(f"the {engine_name} engine is not available")
        flags = (body.runtime_flags or []) + shlex.split(body.raw_runtime_flags or "")
        mode = body.mode or (Mode.EMBEDDING if "--embeddings" in flags else Mode.COMPLETION)
        if scheduler.in_use(engine.name, model.id, mode):
            raise Conflict("the model is answering requests; configure it again when it is idle")
        stored = scheduler.settings.get(engine.name, model.id, mode)
        settings = settings_from_request(body, engine, stored, store)
        scheduler.settings.put(engine.name, model.id, mode, settings)
        await scheduler.unload({model.id}, engine.name)  # the next load uses the new settings
        asyncio.get_running_loop().create_task(_preload(engine, model.id, body.model, mode))
        return PlainTextResponse("", status_code=202)

    async def _preload(engine: Engine, model_id: str, name: str, mode: Mode) -> None:
        with contextlib.suppress(Exception):
            model = store.get(model_id)
            if engine.status().state is InstallState.RUNNING:
                runner = await asyncio.wait_for(
                    scheduler.acquire(engine, model_for_engine(store, model, name), mode), 60
                )
                await scheduler.release(runner)

    @router.post("/engines/_configure", status_code=202)
    async def configure_default(body: ConfigureRequest) -> PlainTextResponse:
        return await configure(body, None)

    @router.post("/engines/{backend}/_configure", status_code=202)
    async def configure_backend(backend: str, body: ConfigureRequest) -> PlainTextResponse:
        return await configure(body, backend)

    @router.get("/engines/_configure")
    def show_configuration(model: str | None = None) -> list[dict[str, Any]]:
        wanted = store.get(model).id if model else None
        out = []
        for backend, model_id, mode, settings in scheduler.settings.all():
            if wanted and model_id != wanted:
                continue
            try:
                tags = store.get(model_id).tags
            except ModelNotFound:
                continue  # the model was removed since
            config = settings.to_json()
            if settings.keep_alive is not None:
                config["keep_alive"] = format_keep_alive(settings.keep_alive)
            out.append(
                {
                    "Backend": backend,
                    "Model": tags[0] if tags else model_id,
                    "ModelID": model_id,
                    "Mode": mode.value,
                    "Config": config,
                }
            )
        return out

    @router.get("/logs")
    async def logs(
        request: Request, follow: bool = False, no_engines: bool = Query(False, alias="no-engines")
    ) -> StreamingResponse:
        files = [logs_dir / "daemon.log"]
        if not no_engines:
            files += sorted(logs_dir.glob("engine-*.log"))
        return StreamingResponse(_log_lines(request, files, follow), media_type="text/plain; charset=utf-8")

    @router.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(await render_metrics(scheduler), media_type="text/plain; version=0.0.4")

    return router


async def _log_lines(request: Request, files: list[Path], follow: bool) -> AsyncIterator[bytes]:
    offsets: dict[Path, int] = {}
    for path in files:
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            offsets[path] = len(data)
            if data:
                yield data
    while follow and not await request.is_disconnected():
        await asyncio.sleep(0.2)
        for path in files:
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                start = offsets.get(path, 0)
                if size < start:  # rotated or truncated
                    start = 0
                if size > start:
                    with open(path, "rb") as handle:
                        handle.seek(start)
                        data = handle.read(size - start)
                    offsets[path] = size
                    yield data


def _label(line: str, labels: str) -> str:
    """Add our labels to one sample line of the Prometheus text format."""
    name, sep, rest = line.partition(" ")
    if "{" in name:
        return name.replace("{", "{" + labels + ",", 1) + sep + rest
    return f"{name}{{{labels}}}{sep}{rest}"


async def render_metrics(scheduler: Scheduler) -> str:
    from modelrunner.scheduler.runner import http_get

    runners = list(scheduler.runners.values())
    lines = [
        "# HELP modelrunner_loaded_runners Engine processes loaded.",
        "# TYPE modelrunner_loaded_runners gauge",
        f"modelrunner_loaded_runners {len(runners)}",
        "# HELP modelrunner_queue_depth Requests waiting for a runner.",
        "# TYPE modelrunner_queue_depth gauge",
        f"modelrunner_queue_depth {scheduler.waiting}",
        "# HELP modelrunner_runner_loads_total Runners loaded since start.",
        "# TYPE modelrunner_runner_loads_total counter",
        f"modelrunner_runner_loads_total {scheduler.counters.loads}",
        "# HELP modelrunner_runner_load_seconds_total Seconds spent loading runners.",
        "# TYPE modelrunner_runner_load_seconds_total counter",
        f"modelrunner_runner_load_seconds_total {scheduler.counters.load_seconds_total:.6f}",
        "# HELP modelrunner_evictions_total Idle runners evicted to make room.",
        "# TYPE modelrunner_evictions_total counter",
        f"modelrunner_evictions_total {scheduler.counters.evictions}",
        "# HELP modelrunner_runner_crashes_total Runners that exited on their own.",
        "# TYPE modelrunner_runner_crashes_total counter",
        f"modelrunner_runner_crashes_total {scheduler.counters.crashes}",
    ]
    seen_meta: set[str] = set()
    for runner in runners:
        if runner.state is not RunnerState.READY:
            continue
        text = await http_get(runner.socket, "/metrics")
        if not text:
            continue
        labels = (
            f'backend="{runner.key.engine}",model="{json.dumps(runner.model.reference)[1:-1]}",'
            f'mode="{runner.key.mode.value}"'
        )
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                if line not in seen_meta:
                    seen_meta.add(line)
                    lines.append(line)
                continue
            lines.append(_label(line, labels))
    return "\n".join(lines) + "\n"
