"""The scheduler: one runner per (engine, model, mode), loaded on demand and kept warm.

Single-flight loads (concurrent first requests start one process), in-flight reference counts,
keep-alive timers, least-recently-used eviction of idle runners to respect a cap on loaded runners and a
memory budget, and a bounded wait queue. Knows engines only through engines/base.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner.engines.base import Engine, Mode, ModelForEngine
from modelrunner.errors import BadRequest, ModelNotFound, ModelRunnerError
from modelrunner.scheduler.durations import NEVER, format_keep_alive
from modelrunner.scheduler.runner import LoadError, Runner, RunnerKey, RunnerState, end_orphans
from modelrunner.scheduler.settings import ModelSettings, SettingsStore

DEFAULT_KEEP_ALIVE = 300.0


class Busy(ModelRunnerError):
    """Too many requests are already waiting for a runner; the client should retry later."""

    status_code = 503
    retry_after = 5


class InsufficientMemory(ModelRunnerError):
    status_code = 507


@dataclass
class SchedulerLimits:
    max_runners: int
    memory_budget: int
    max_waiting: int = 64
    default_keep_alive: float = DEFAULT_KEEP_ALIVE


@dataclass
class Counters:
    loads: int = 0
    evictions: int = 0
    load_seconds_total: float = 0.0
    crashes: int = 0


class Scheduler:
    def __init__(
        self,
        engines: Mapping[str, Engine],
        settings: SettingsStore,
        run_dir: Path,
        logs_dir: Path,
        limits: SchedulerLimits,
        bundles: Callable[[str], Path] | None = None,
    ) -> None:
        self.engines = engines
        self.bundles = bundles  # model ID -> bundle folder, for draft models of speculative decoding
        self.settings = settings
        self.run_dir = run_dir
        self.logs_dir = logs_dir
        self.limits = limits
        self.runners: dict[RunnerKey, Runner] = {}
        self.counters = Counters()
        self.waiting = 0
        self._changed = asyncio.Condition()
        self._closing = False
        self._next_slot = 0
        run_dir.mkdir(parents=True, exist_ok=True)
        self.orphans_ended = end_orphans(run_dir / "pids")

    # -- acquiring and releasing ------------------------------------------------------------------

    async def acquire(
        self, engine: Engine, model: ModelForEngine, mode: Mode, keep_alive: float | None = None
    ) -> Runner:
        """A ready runner for (engine, model, mode), loading it if needed; the caller must release it."""
        key = RunnerKey(engine.name, model.id, mode)
        async with self._changed:
            while True:
                if self._closing:
                    raise Busy("the model runner is shutting down")
                runner = self.runners.get(key)
                if runner is not None and runner.state is RunnerState.DEFUNCT:
                    await self._remove(runner)
                    runner = None
                if runner is not None and runner.state in (RunnerState.LOADING, RunnerState.READY):
                    break
                runner = self._new_runner(key, engine, model, mode)
                if self._make_room(runner.memory):
                    self.runners[key] = runner
                    runner.load_task = asyncio.get_running_loop().create_task(self._load(runner))
                    break
                if self.waiting >= self.limits.max_waiting:
                    raise Busy("too many requests are waiting for a model to load; retry later")
                self.waiting += 1
                try:
                    await self._changed.wait()
                finally:
                    self.waiting -= 1
            runner.in_use += 1
            if runner.idle_timer:
                runner.idle_timer.cancel()
                runner.idle_timer = None
            if keep_alive is not None:
                runner.keep_alive = keep_alive
        assert runner.load_task is not None
        try:
            await asyncio.shield(runner.load_task)
        except BaseException:
            await self.release(runner)
            raise
        return runner

    def _new_runner(self, key: RunnerKey, engine: Engine, model: ModelForEngine, mode: Mode) -> Runner:
        stored = self.settings.get(engine.name, model.id, mode) or ModelSettings()
        settings = stored.runner_settings(self._draft_bundle(stored))
        self._next_slot += 1
        socket = self.run_dir / f"runner-{self._next_slot}.sock"
        spec = engine.launch_spec(model, mode, settings, socket)
        keep_alive = stored.keep_alive if stored.keep_alive is not None else self.limits.default_keep_alive
        log = self.logs_dir / f"engine-{engine.name}.log"
        return Runner(
            key, model, spec, engine.estimate_memory(model, settings), log, self.run_dir / "pids", keep_alive
        )

    def _draft_bundle(self, stored: ModelSettings) -> Path | None:
        if stored.speculative_draft_model is None:
            return None
        if self.bundles is None:
            raise BadRequest("speculative decoding needs the model store")
        try:
            return self.bundles(stored.speculative_draft_model)
        except ModelNotFound:
            raise ModelNotFound(
                f"the draft model {stored.speculative_draft_model[:19]} configured for speculative decoding "
                "is not in the store any more; configure the model again"
            ) from None

    def _used_memory(self) -> int:
        return sum(r.memory for r in self.runners.values())

    def _make_room(self, needed: int) -> bool:
        """Evict idle runners, least recently used first, until a new one fits; False if it cannot yet."""
        if needed > self.limits.memory_budget:
            raise InsufficientMemory(
                f"the model needs about {needed / 1e9:.2f} GB but the memory budget is "
                f"{self.limits.memory_budget / 1e9:.2f} GB; free memory or raise MODEL_RUNNER_MEMORY_BUDGET"
            )

        def fits() -> bool:
            return (
                len(self.runners) < self.limits.max_runners
                and self._used_memory() + needed <= self.limits.memory_budget
            )

        idle = sorted((r for r in self.runners.values() if r.in_use == 0), key=lambda r: r.last_used)
        while not fits() and idle:
            victim = idle.pop(0)
            self.counters.evictions += 1
            self.runners.pop(victim.key, None)
            asyncio.get_running_loop().create_task(victim.stop())
        return fits()

    async def _load(self, runner: Runner) -> None:
        try:
            await runner.start()
            self.counters.loads += 1
            self.counters.load_seconds_total += runner.load_seconds
            asyncio.get_running_loop().create_task(self._watch(runner))
        except BaseException:
            async with self._changed:
                if self.runners.get(runner.key) is runner:
                    del self.runners[runner.key]
                self._changed.notify_all()
            with contextlib.suppress(Exception):
                await runner.stop(grace=2)
            raise

    async def _watch(self, runner: Runner) -> None:
        """A runner that exits on its own is defunct: dropped when idle, reloaded by the next request."""
        await runner.exited.wait()
        if runner.state is RunnerState.DEFUNCT:
            self.counters.crashes += 1
            async with self._changed:
                if runner.in_use == 0 and self.runners.get(runner.key) is runner:
                    del self.runners[runner.key]
                self._changed.notify_all()

    async def release(self, runner: Runner) -> None:
        async with self._changed:
            runner.in_use -= 1
            runner.last_used = time.time()
            if runner.in_use == 0:
                if runner.state is RunnerState.DEFUNCT and self.runners.get(runner.key) is runner:
                    del self.runners[runner.key]
                elif runner.keep_alive != NEVER and runner.state is RunnerState.READY:
                    loop = asyncio.get_running_loop()
                    runner.idle_timer = loop.call_later(
                        runner.keep_alive, lambda: loop.create_task(self._expire(runner))
                    )
            self._changed.notify_all()

    async def _expire(self, runner: Runner) -> None:
        async with self._changed:
            if runner.in_use or self.runners.get(runner.key) is not runner:
                return
            del self.runners[runner.key]
            self._changed.notify_all()
        await runner.stop()

    async def _remove(self, runner: Runner) -> None:
        """Caller holds the lock."""
        if self.runners.get(runner.key) is runner:
            del self.runners[runner.key]
        asyncio.get_running_loop().create_task(runner.stop())

    # -- admin ----------------------------------------------------------------------------------

    async def unload(self, model_ids: set[str] | None, engine: str | None = None) -> int:
        """Stop idle runners of the given models (all when None); in-use runners are left alone."""
        async with self._changed:
            victims = [
                r
                for r in self.runners.values()
                if r.in_use == 0
                and (model_ids is None or r.key.model_id in model_ids)
                and (engine is None or r.key.engine == engine)
            ]
            for runner in victims:
                del self.runners[runner.key]
            self._changed.notify_all()
        await asyncio.gather(*(r.stop() for r in victims))
        return len(victims)

    def has_runner(self, engine: str, model_id: str, mode: Mode) -> bool:
        return RunnerKey(engine, model_id, mode) in self.runners

    def in_use(self, engine: str, model_id: str, mode: Mode) -> bool:
        runner = self.runners.get(RunnerKey(engine, model_id, mode))
        return runner is not None and runner.in_use > 0

    def ps(self) -> list[dict[str, Any]]:
        return [
            {
                "backend_name": r.key.engine,
                "model_name": r.model.reference,
                "model_id": r.model.id,
                "mode": r.key.mode.value,
                "last_used": int(r.last_used),
                "in_use": r.in_use > 0,
                "loading": r.state is RunnerState.LOADING,
                "keep_alive": format_keep_alive(r.keep_alive),
                "memory_estimate": r.memory,
                "pid": r.process.pid if r.process else None,
                **({"layout": r.spec.layout} if r.spec.layout else {}),
            }
            for r in self.runners.values()
        ]

    async def shutdown(self, drain_seconds: float = 10.0) -> None:
        """Refuse new loads, let in-flight requests finish (bounded), then stop every engine."""
        self._closing = True
        deadline = time.monotonic() + drain_seconds
        while any(r.in_use for r in self.runners.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        runners = list(self.runners.values())
        self.runners.clear()
        await asyncio.gather(*(r.stop() for r in runners), return_exceptions=True)


__all__ = ["Busy", "InsufficientMemory", "LoadError", "Scheduler", "SchedulerLimits"]
