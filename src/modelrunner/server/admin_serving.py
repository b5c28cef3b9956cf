"""What the scheduler and observability routes do (server/admin_api.py is their router), without HTTP:
the runners as DMR's BackendStatus, unloading, the stored settings, memory estimates, clusters, logs and
the Prometheus metrics. Methods take validated bodies and queries and return what is answered, or raise
the ModelRunnerError that server/errors.py answers.

The answers of the DMR routes have the shapes of DMR's Go types (`pkg/inference/scheduling/api.go`,
`pkg/inference/backend.go`), so DMR's own CLI and Compose provider decode them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from modelrunner.artifact import gojson
from modelrunner.engines.base import DraftCounts, Mode
from modelrunner.engines.registry import EngineRegistry
from modelrunner.errors import BadRequest, ModelNotFound
from modelrunner.scheduler.runner import RunnerState
from modelrunner.scheduler.scheduler import Scheduler
from modelrunner.scheduler.settings import ModelSettings, backend_configuration
from modelrunner.scheduler.warm import warm_metrics
from modelrunner.server.lifecycle import Lifecycle, model_for_engine
from modelrunner.server.log_files import LogStreamer, ModelFilter, normal_name
from modelrunner.store.store import ModelStore

DRAFT_COUNTS_SECONDS = 1.0  # an engine that does not answer by then shows its last counts


class UnloadRequest(BaseModel):
    """DMR's UnloadRequest; its CLI sends `"backend": ""` for every backend and `"models": null` with all."""

    model_config = ConfigDict(extra="forbid")
    all: bool = False
    backend: str | None = None
    models: list[str] | None = Field(default=None, max_length=1000)


class AdminServing:
    def __init__(
        self,
        store: ModelStore,
        scheduler: Scheduler,
        engines: EngineRegistry,
        logs_dir: Path,
        lifecycle: Lifecycle,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.engines = engines
        self.logs_dir = logs_dir
        self.lifecycle = lifecycle
        self._draft_counts: dict[str, DraftCounts] = {}  # by runner tag: the last read while it was idle

    async def ps(self) -> list[dict[str, Any]]:
        """DMR's BackendStatus of each runner. A drafting runner's counts are asked of its engine while it is
        idle, and remembered: the dashboard asks every 2 s, and an engine asked while it generates can be
        slower to see a client leave (the /slots finding of scheduler/conversations.py)."""
        drafting = [r for r in self.scheduler.runners.values() if r.spec.drafting]
        idle = [r for r in drafting if r.state is RunnerState.READY and not r.in_use]
        counts = await asyncio.gather(
            *(self.engines[r.key.engine].draft_counts(r.spec.socket, DRAFT_COUNTS_SECONDS) for r in idle)
        )
        known = {r.tag: self._draft_counts[r.tag] for r in drafting if r.tag in self._draft_counts}
        self._draft_counts = known | {r.tag: c for r, c in zip(idle, counts, strict=True) if c is not None}
        return [backend_status(entry) for entry in self.scheduler.ps(self._draft_counts)]

    async def unload(self, body: UnloadRequest) -> dict[str, int]:
        backend = body.backend or None  # "" (DMR's CLI default) means every backend
        if body.all:
            return {"unloaded_runners": await self.scheduler.unload(None, backend)}
        if not body.models:
            raise BadRequest("name the models to unload, or set all")
        return {"unloaded_runners": await self.scheduler.unload(self.resolve_loaded(body.models), backend)}

    def resolve_loaded(self, names: list[str]) -> set[str]:
        """Model IDs for names as the user typed them (`smollm2`, `ai/smollm2:latest`, an ID), resolved
        like DMR does; a runner is also found by the name it was loaded under (its model may be gone)."""
        ids: set[str] = set()
        for name in names:
            with contextlib.suppress(ModelNotFound, BadRequest):
                ids.add(self.store.get(name).id)
            ids.update(
                r.key.model_id
                for r in list(self.scheduler.runners.values())
                if names_runner(name, r.model.reference, r.key.model_id)
            )
        return ids

    def configuration(self, model: str | None) -> list[dict[str, Any]]:
        """DMR's `[{Backend, Model, ModelID, Mode, Config}]`; a filter naming no model matches nothing."""
        wanted = None
        if model:
            try:
                wanted = self.store.get(model).id
            except (ModelNotFound, BadRequest):
                return []
        out = []
        for backend, model_id, mode, settings in self.scheduler.settings.all():
            if wanted and model_id != wanted:
                continue
            try:
                tags = self.store.get(model_id).tags
            except ModelNotFound:
                continue  # the model was removed since
            out.append(
                {
                    "Backend": backend,
                    "Model": tags[0] if tags else "",
                    "ModelID": model_id,
                    "Mode": mode.value,
                    "Config": backend_configuration(settings, _draft_name(self.store, settings)),
                }
            )
        return out

    def estimate(self, model: str, backend: str | None) -> dict[str, Any]:
        """Ours: the memory one runner of the model needs on this machine, with its stored settings (what
        `model generate` requests for a pod)."""
        stored = self.store.get(model)
        engine = self.engines.resolve(backend, stored.config)
        settings = self.scheduler.settings.get(engine.name, stored.id, Mode.COMPLETION) or ModelSettings()
        target = model_for_engine(self.store, stored, model)
        memory = engine.estimate_memory(target, settings.runner_settings())
        return {"model": model, "model_id": stored.id, "backend": engine.name, "memory_bytes": memory}

    async def cluster(self) -> dict[str, list[dict[str, object]]]:
        """Ours: what the engines use beyond this machine (Ray clusters: nodes, resources), probed now."""
        stored = self.scheduler.settings.all()
        out = {}
        for engine in self.engines.values():
            mine = [
                settings.runner_settings() for backend, _, _, settings in stored if backend == engine.name
            ]
            found = await asyncio.to_thread(engine.cluster_status, mine)
            if found:
                out[engine.name] = found
        return out

    def logs(
        self, follow: bool, with_engines: bool, model: str | None, gone: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[bytes]:
        """DMR's log route (pkg/logs/http_handler.go: follow, no-engines), plus `model` to keep only the
        lines about one model and its engines' logs; `gone` says when the reader has left."""
        wanted = ModelFilter(self.store, model) if model else None
        return LogStreamer(self.logs_dir, with_engines, wanted, gone).stream(follow)

    async def metrics(self) -> str:
        return await render_metrics(self.scheduler, self.lifecycle)


def names_runner(name: str, reference: str, model_id: str) -> bool:
    """Whether `name`, as typed, names a runner whose model may have left the store: the name it was loaded
    under in any spelling (`tiny`: `ai/tiny:latest`), or its ID as `ps` shows it (12 hex digits, or more)."""
    if normal_name(name) == normal_name(reference):
        return True
    digits = name.lower().removeprefix("sha256:")
    return len(digits) >= 12 and model_id.removeprefix("sha256:").startswith(digits)


def _draft_name(store: ModelStore, settings: ModelSettings) -> str | None:
    return _model_name(store, settings.speculative_draft_model) if settings.speculative_draft_model else None


def _model_name(store: ModelStore, model_id: str) -> str:
    with contextlib.suppress(ModelNotFound):
        tags = store.get(model_id).tags
        if tags:
            return tags[0]
    return model_id


def backend_status(entry: dict[str, Any]) -> dict[str, Any]:
    """One runner of `scheduler.ps()` as DMR's BackendStatus (plus our fields, which Go decoders skip):
    `last_used` is an RFC 3339 time, Go's zero time while the runner is in use (as DMR reports it)."""
    return {
        **entry,
        "last_used": (
            gojson.ZERO_TIME
            if entry["in_use"]
            else gojson.time_text(datetime.fromtimestamp(entry["last_used"], UTC))
        ),
    }


def _label(line: str, labels: str) -> str:
    """Add our labels to one sample line of the Prometheus text format."""
    name, sep, rest = line.partition(" ")
    if "{" in name:
        return name.replace("{", "{" + labels + ",", 1) + sep + rest
    return f"{name}{{{labels}}}{sep}{rest}"


def _gauge(name: str, text: str, value: float) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {value}"]


async def render_metrics(scheduler: Scheduler, lifecycle: Lifecycle) -> str:
    """The scheduler's gauges and counters, the daemon's request metrics (server/request_metrics.py),
    then each ready runner's own metrics labelled with its backend, model and mode."""
    from modelrunner.scheduler.runner import http_get

    runners = list(scheduler.runners.values())
    lines = [
        *_gauge("modelrunner_loaded_runners", "Engine processes loaded.", len(runners)),
        *_gauge("modelrunner_queue_depth", "Requests waiting for a runner.", scheduler.waiting),
        *_gauge(
            "modelrunner_requests_running",
            "Requests holding a runner (being answered by an engine).",
            sum(1 for exchange in list(lifecycle.open) if exchange.runners),
        ),
        *_gauge(
            "modelrunner_memory_in_use_bytes",
            "Memory the loaded runners are estimated to use.",
            sum(runner.memory for runner in runners),
        ),
        *_gauge(
            "modelrunner_memory_budget_bytes",
            "Memory the scheduler may give to runners.",
            scheduler.limits.memory_budget,
        ),
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
        *lifecycle.metrics.render().splitlines(),
        *(warm_metrics(scheduler.warm.counters) if scheduler.warm is not None else []),
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
