"""The daemon's application: raw ASGI inference relay and FastAPI routers, behind the security middleware.

HTTP front (server/front.py): plain inference requests relayed byte for byte; all others:
LifecycleMiddleware -> SecurityMiddleware -> Dispatcher -> inference routes (InferenceHandler)
                                                        -> everything else (FastAPI: models, openai listing,
                                                           admin, engines, Ollama, Anthropic, Responses)
Both paths share one request lifecycle (server/lifecycle.py): the exchange of each request, the runners it
holds, the request recorder.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import PlainTextResponse

from modelrunner import __version__, config
from modelrunner.engines.base import Engine
from modelrunner.engines.registry import EngineRegistry, default_registry
from modelrunner.scheduler import rundir
from modelrunner.scheduler.kv_persist import KvStore
from modelrunner.scheduler.memory import memory_budget
from modelrunner.scheduler.scheduler import Scheduler, SchedulerLimits
from modelrunner.scheduler.settings import SettingsStore
from modelrunner.scheduler.warm import WarmResume
from modelrunner.server.admin_api import build_admin_router, daemon_user_only
from modelrunner.server.anthropic_api import build_anthropic_router
from modelrunner.server.dashboard import build_dashboard_router
from modelrunner.server.distribution_api import build_distribution_router
from modelrunner.server.engines_api import build_engines_router
from modelrunner.server.errors import install_error_handlers
from modelrunner.server.front import FastPath
from modelrunner.server.inference import InferenceHandler
from modelrunner.server.lifecycle import Inference, Lifecycle, LifecycleMiddleware
from modelrunner.server.localuser import ensure_token
from modelrunner.server.models_api import build_models_router
from modelrunner.server.ollama_api import build_ollama_router
from modelrunner.server.ollama_create import build_ollama_create_router
from modelrunner.server.openai_api import build_openai_router
from modelrunner.server.proxy import App, Receive, Scope, Send
from modelrunner.server.recorder import Recorder, build_recorder_router, recording_enabled
from modelrunner.server.responses_api import build_responses_router
from modelrunner.server.routes import alias_target, match_route
from modelrunner.server.security import SecurityMiddleware, SecurityPolicy
from modelrunner.server.signing_api import build_signing_router
from modelrunner.server.transfers import TransferManager
from modelrunner.store.store import ModelStore


def default_engines() -> EngineRegistry:
    return EngineRegistry.of(default_registry())


def runtime_dir() -> Path:
    """Sockets and pid records of runners (scheduler/rundir.py)."""
    return rundir.runtime_dir(config.runner_home())


def scheduler_limits() -> SchedulerLimits:
    cpus = os.cpu_count() or 2
    return SchedulerLimits(
        max_runners=int(os.environ.get("MODEL_RUNNER_MAX_RUNNERS") or min(cpus, 8)),
        memory_budget=memory_budget(),
        max_waiting=int(os.environ.get("MODEL_RUNNER_MAX_QUEUE") or 64),
    )


@dataclass
class Daemon:
    """The pieces of a running daemon, for tests and for the entry point."""

    store: ModelStore
    scheduler: Scheduler
    engines: EngineRegistry
    asgi: App
    fast: FastPath  # what the HTTP front answers without the ASGI stack (server/front.py)
    lifecycle: Lifecycle


def go_clean_path(path: str) -> str:
    """Go's ServeMux cleanPath: rooted, `//`, `.` and `..` resolved, a trailing slash kept."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    cleaned = "/" + "/".join(parts)
    return cleaned + "/" if path.endswith("/") and cleaned != "/" else cleaned


def go_path_clean(path: str) -> str:
    """Go's path.Clean of a rooted path: as cleanPath, without the trailing slash."""
    cleaned = go_clean_path(path)
    return cleaned.rstrip("/") or "/"


_GO_HTML_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"})


async def redirect_to_clean_path(scope: Scope, send: Send, location: str) -> None:
    """What Go's ServeMux answers for a path not in its canonical form (DMR's muxes): 301 to the cleaned
    path with the query kept, for every method; http.Redirect's small HTML body for GET only."""
    headers = [(b"location", location.encode("latin-1"))]
    body = b""
    if scope["method"] in ("GET", "HEAD"):
        headers.append((b"content-type", b"text/html; charset=utf-8"))
    if scope["method"] == "GET":
        escaped = location.translate(_GO_HTML_ESCAPES)
        body = f'<a href="{escaped}">Moved Permanently</a>.\n\n'.encode("latin-1")
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": 301, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Dispatcher:
    """Paths with `//` are cleaned and served, other paths not in Go's canonical form redirected to it (as
    DMR's NormalizedServeMux over a ServeMux); inference routes go straight to the relay;
    `/v1/...` aliases become `/engines/v1/...` (both in server/routes.py)."""

    def __init__(self, api: App, inference: InferenceHandler) -> None:
        self.api = api
        self.inference = inference

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            raw = (scope.get("raw_path") or path.encode("latin-1")).decode("latin-1")  # Go cleans it escaped
            if "//" in path:  # routing.go NormalizedServeMux: `//` is cleaned and served, not redirected
                path, raw = go_path_clean(path), go_path_clean(raw)
                scope = {**scope, "path": path, "raw_path": raw.encode("latin-1")}
            if go_clean_path(raw) != raw:
                query = (scope.get("query_string") or b"").decode("latin-1")
                await redirect_to_clean_path(scope, send, go_clean_path(raw) + ("?" + query if query else ""))
                return
            route = match_route(path)
            if route is not None:
                await self.inference(scope, receive, send, route)
                return
            target = alias_target(path)
            if target is not None:
                scope = {**scope, "path": target, "raw_path": target.encode()}
        await self.api(scope, receive, send)


def build_daemon(
    store: ModelStore | None = None,
    engines: Mapping[str, Engine] | None = None,
    bind_host: str = "127.0.0.1",
    extra_listen: Sequence[config.ListenAddress] = (),
) -> Daemon:
    store = store or ModelStore(config.models_path())
    engines = EngineRegistry(engines) if engines is not None else default_engines()
    logs_dir = config.logs_dir()
    kv_cache = KvStore(store.layout)  # saved prompt caches (warm resume)
    scheduler = Scheduler(
        engines,
        SettingsStore(store.layout.configs_dir),
        runtime_dir(),
        logs_dir,
        scheduler_limits(),
        store.bundle,
        WarmResume(kv_cache),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        scheduler.end_orphans()  # before listening; `model serve` holds the home's lock by now
        yield
        await scheduler.shutdown()  # SIGTERM: drain, then stop every engine process

    api = FastAPI(title="modelrunner", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan)
    install_error_handlers(api)

    @api.get("/", response_class=PlainTextResponse)  # HEAD too, as every GET route (server/lifecycle.py)
    def root() -> str:
        return "Docker Model Runner is running"

    @api.get("/version")
    def version() -> dict[str, str]:
        return {"version": __version__}

    @api.get("/engines/df")
    def disk_usage() -> dict[str, Any]:
        default = engines.default
        return {
            "models_disk_usage": store.disk_usage(),
            "default_backend_disk_usage": default.disk_usage() if default else 0,
            "kv_cache_disk_usage": kv_cache.disk_usage(),
        }

    recorder = Recorder() if recording_enabled() else None
    lifecycle = Lifecycle(scheduler, recorder)
    inference = Inference(store, scheduler, engines, lifecycle)  # every API gets its runners here
    transfers = TransferManager(store)  # one for every API: shared downloads, one limit on concurrent pulls
    api.include_router(build_distribution_router(store, transfers))
    token = ensure_token(config.local_token_file())  # proves a local caller is the daemon's user
    policy = SecurityPolicy.from_env(bind_host, [address.host for address in extra_listen])
    daemon_user = daemon_user_only(token, policy.api_key)  # prompts, answers and logs: not for everyone
    api.include_router(build_signing_router(store))  # before the models router's catch-all POST
    api.include_router(build_models_router(store, token))
    api.include_router(build_openai_router(store))
    api.include_router(build_admin_router(store, scheduler, engines, logs_dir, lifecycle, daemon_user))
    reach = [str(address) for address in extra_listen]  # where containers reach us (`status --json`)
    api.include_router(build_engines_router(engines, lambda name: scheduler.unload(None, name), reach))
    api.include_router(build_recorder_router(recorder, store), dependencies=[Depends(daemon_user)])
    api.include_router(build_ollama_router(inference, transfers))
    api.include_router(build_ollama_create_router(store))
    api.include_router(build_anthropic_router(inference))
    api.include_router(build_responses_router(inference))
    api.include_router(build_dashboard_router(store, scheduler, token))
    handler = InferenceHandler(inference)
    asgi = LifecycleMiddleware(SecurityMiddleware(Dispatcher(api, handler), policy), lifecycle)
    fast = FastPath(handler, policy, lifecycle)
    scheduler.on_retire.append(lambda runner: fast.pool.close_idle(str(runner.socket)))
    return Daemon(store, scheduler, engines, asgi, fast, lifecycle)
