"""Scheduler and observability routes: /engines/ps, /engines/unload, /engines/_configure, /logs, /metrics.

The router: it parses bodies and queries, calls server/admin_serving.py and answers; `_configure` (its
body's checks below) is served here. The bodies of the DMR routes have the shapes of DMR's Go types
(`pkg/inference/scheduling/api.go`), so DMR's own CLI and Compose provider send them as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, create_model

from modelrunner.compat.bodies import json_body
from modelrunner.engines.base import Engine, InstallState, Mode
from modelrunner.engines.registry import EngineRegistry, configuration_types, engine_format
from modelrunner.engines.settings import is_number
from modelrunner.errors import BadRequest, ModelNotFound, PermissionDenied
from modelrunner.eventlog import event
from modelrunner.scheduler.durations import parse_keep_alive
from modelrunner.scheduler.scheduler import Scheduler
from modelrunner.scheduler.settings import ModelSettings, engine_settings_from_request
from modelrunner.server.admin_serving import AdminServing, UnloadRequest
from modelrunner.server.lifecycle import Lifecycle, model_for_engine
from modelrunner.server.localuser import caller_is_daemon_user
from modelrunner.store.store import ModelStore, StoredModel

log = logging.getLogger(__name__)


class ConfigureBody(BaseModel):
    """DMR's ConfigureRequest (hyphenated keys as DMR's CLI sends them), less the engines' own objects
    (`ConfigureRequest` adds them)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    model: str = Field(min_length=1)
    mode: Mode | None = None
    context_size: int | None = Field(default=None, alias="context-size")
    runtime_flags: list[str] | None = Field(default=None, alias="runtime-flags", max_length=200)
    raw_runtime_flags: str | None = Field(default=None, alias="raw-runtime-flags", max_length=10_000)
    keep_alive: str | int | float | None = None
    speculative: dict[str, Any] | None = None


# The request with each engine's object (`llamacpp`, `vllm`) by its settings type's key: read by that type
# (scheduler/settings.py); any other key is refused (a misspelt one is not silently dropped).
_ENGINE_OBJECTS: dict[str, Any] = {
    kind.key: (dict[str, Any] | None, None) for kind in configuration_types() if kind.key is not None
}
ConfigureRequest = create_model("ConfigureRequest", __base__=ConfigureBody, **_ENGINE_OBJECTS)


def split_raw_flags(raw: str) -> list[str]:
    """DMR's `raw-runtime-flags`: one string split as a shell would."""
    try:
        return shlex.split(raw)
    except ValueError as exc:
        raise BadRequest(f"invalid raw-runtime-flags: {exc}") from None


def requested_flags(body: ConfigureBody) -> list[str] | None:
    """The runtime flags of a request as DMR reads them: the list when it is not empty, else the raw
    string; None when the request sets no flags at all (the engine's defaults)."""
    if body.runtime_flags:
        return list(body.runtime_flags)
    if body.raw_runtime_flags is not None:
        return split_raw_flags(body.raw_runtime_flags)
    return [] if body.runtime_flags is not None else None


def configured_keep_alive(value: object) -> float:
    """keep_alive of `_configure`: the shared parser (finite, at most Go's longest duration), and no negative
    value but -1 ("never unload"), which is all a stored setting may say (DMR reads any negative as never)."""
    text = str(value).strip() if isinstance(value, str | int | float) and not isinstance(value, bool) else ""
    if text.startswith("-") and text not in ("-1", "-1.0"):
        raise BadRequest("keep_alive may not be negative; use -1 to keep the model loaded")
    return parse_keep_alive(value)


def settings_from_request(
    body: ConfigureBody, flags: list[str] | None, engine: Engine, store: ModelStore
) -> ModelSettings:
    """The request's settings as the model's whole configuration: what it leaves out is the default (DMR's
    ConfigureRunner builds a new BackendConfiguration from each request; nothing is merged)."""
    settings = ModelSettings()
    if body.context_size is not None:
        if body.context_size == 0 or body.context_size < -1 or body.context_size > 2**31 - 1:
            raise BadRequest(
                "context-size must be a positive number of tokens, or -1 for the model's maximum"
            )
        settings.context_size = body.context_size
    if flags is not None:
        engine.validate_runtime_flags(flags)
        settings.runtime_flags = flags
    if body.keep_alive is not None:
        settings.keep_alive = configured_keep_alive(body.keep_alive)
    # the engines' objects (`llamacpp`, `vllm`), each read by its engine's settings type
    settings.engines = engine_settings_from_request(body.model_dump(by_alias=True), engine.name)
    if body.speculative is not None:
        speculative_settings(body.speculative, engine, store, settings)
    return settings


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
    if not engine.takes_draft_model:
        raise BadRequest(f"the {engine.name} engine takes no draft model for speculative decoding")
    try:
        model = store.get(draft)
    except ModelNotFound:
        raise ModelNotFound(f"draft model {draft[:200]} not found; pull or package it first") from None
    if engine_format(model.config) not in engine.formats:  # the model's own engine runs its draft
        kinds = " or ".join(sorted(kind.upper() for kind in engine.formats))
        raise BadRequest(
            f"the draft model must be a {kinds} model, and {draft[:200]} is {model.config.format}"
        )
    tokens = spec.get("num_tokens")
    if tokens is not None and not (is_number(tokens, int) and 1 <= tokens <= 128):
        raise BadRequest("num_tokens must be a number of tokens from 1 to 128")
    rate = spec.get("min_acceptance_rate")
    if rate is not None and not (is_number(rate, int | float) and 0 <= rate <= 1):
        raise BadRequest("min_acceptance_rate must be a number from 0 to 1")
    settings.speculative_draft_model = model.id
    settings.speculative_num_tokens = tokens
    settings.speculative_min_acceptance_rate = None if rate is None else float(rate)


def daemon_user_only(token: str, api_key: str | None) -> Callable[[Request], None]:
    """A route dependency for what holds the daemon user's data: the prompts and answers the recorder keeps
    (`GET /engines/requests`) and the logs (`GET /logs`). Without an API key every local user reaches the
    daemon, so only its own user (server/localuser.py) is served; with one, the key (checked by the
    security middleware) decides, as on every route."""

    def check(request: Request) -> None:
        if api_key is None and not caller_is_daemon_user(request.scope, token):
            raise PermissionDenied(
                "the recorded requests and the logs are served only to the user the model runner runs as "
                "(they hold its prompts and answers); to share them, give the model runner an API key "
                "(MODEL_RUNNER_API_KEY) and its holders read them"
            )

    return check


def build_admin_router(
    store: ModelStore,
    scheduler: Scheduler,
    engines: EngineRegistry,
    logs_dir: Path,
    lifecycle: Lifecycle,
    daemon_user: Callable[[Request], None],
) -> APIRouter:
    """`daemon_user`: the dependency of the routes only the daemon's user may read (`daemon_user_only`)."""
    serving = AdminServing(store, scheduler, engines, logs_dir, lifecycle)
    router = APIRouter()

    @router.get("/engines/ps")
    async def ps() -> list[dict[str, Any]]:
        return await serving.ps()

    @router.post("/engines/unload")
    async def unload(body: UnloadRequest = Depends(json_body(UnloadRequest))) -> dict[str, int]:
        return await serving.unload(body)

    async def configure(body: ConfigureBody, backend: str | None) -> PlainTextResponse:
        try:
            model: StoredModel | None = store.get(body.model)
        except ModelNotFound:
            model = None  # accepted all the same, as DMR's ConfigureRunner does (below)
        if model is not None:
            engine = engines.resolve(backend, model.config)
        else:  # its settings are checked against the engine asked for (nothing will run them)
            engine = engines.find(backend) if backend is not None else engines.resolve(None, "")
        flags = requested_flags(body)
        mode = body.mode or (Mode.EMBEDDING if flags and "--embeddings" in flags else Mode.COMPLETION)
        settings = settings_from_request(body, flags, engine, store)  # bad settings: a 400 either way
        if model is None:
            # DMR (scheduler.go ConfigureRunner) keys the configuration by the name when no model has it,
            # where no load ever looks (loads key by the model's ID), and its preload finds no model: a 202
            # that configures nothing. The same here, without keeping what no load would read.
            event(log, "configure_ignored", reason="model_not_in_store", model=body.model[:200])
            return PlainTextResponse("", status_code=202)
        await scheduler.configure(engine.name, model.id, mode, settings)  # 409 while it answers requests
        scheduler.preload(_preload(engine, model.id, body.model, mode))  # as DMR, which Compose relies on
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
    async def configure_default(
        body: ConfigureBody = Depends(json_body(ConfigureRequest)),
    ) -> PlainTextResponse:
        return await configure(body, None)

    @router.post("/engines/{backend}/_configure", status_code=202)
    async def configure_backend(
        backend: str, body: ConfigureBody = Depends(json_body(ConfigureRequest))
    ) -> PlainTextResponse:
        return await configure(body, backend)

    @router.get("/engines/_configure")
    def show_configuration(model: str | None = None) -> list[dict[str, Any]]:
        return serving.configuration(model)

    @router.get("/engines/estimate")
    def estimate(model: str, backend: str | None = None) -> dict[str, Any]:
        return serving.estimate(model, backend)

    @router.get("/engines/cluster")
    async def cluster() -> dict[str, list[dict[str, object]]]:
        return await serving.cluster()

    @router.get("/logs", dependencies=[Depends(daemon_user)])
    async def logs(
        request: Request,
        follow: bool = False,
        no_engines: bool = Query(False, alias="no-engines"),
        model: str | None = Query(None, min_length=1, max_length=512),
    ) -> StreamingResponse:
        lines = serving.logs(follow, not no_engines, model, request.is_disconnected)
        return StreamingResponse(lines, media_type="text/plain; charset=utf-8")

    @router.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(await serving.metrics(), media_type="text/plain; version=0.0.4")

    return router
