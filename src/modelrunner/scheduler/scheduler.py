"""The scheduler: one runner per (engine, model, mode), loaded on demand and kept warm.

Single-flight loads (concurrent first requests start one process), in-flight reference counts,
keep-alive timers, least-recently-used eviction of idle runners to respect a cap on loaded runners and a
memory budget, a wait queue (first come first served across models, bounded in length and in time; a
request whose client left is cancelled, and leaves it at once), and a watchdog that ends engines that
stop answering while requests wait on them. Knows engines only through engines/base.py.

A runner that is retired (evicted, unloaded, idle, crashed, frozen) leaves `runners` at once but stays in
`stopping`, its memory still counted, until its whole process group is gone: a load that needed the room
waits for that, so the budget is never exceeded while an engine shuts down.

Every decision is one log line (modelrunner/eventlog.py). Lines written for a request carry its request
id (the context variable is inherited by the load it starts); background work (idle expiry, the watchdog,
crashes) runs without one and names the model instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import os
import shlex
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelrunner import eventlog
from modelrunner.config import env_seconds
from modelrunner.engines.base import DraftCounts, Engine, Mode, ModelForEngine
from modelrunner.errors import BadRequest, Conflict, ModelNotFound, ModelRunnerError
from modelrunner.eventlog import event
from modelrunner.scheduler import rundir
from modelrunner.scheduler.durations import NEVER, format_keep_alive
from modelrunner.scheduler.runner import (
    STOP_GRACE,
    LoadError,
    Runner,
    RunnerKey,
    RunnerState,
    end_orphans,
    process_stat,
)
from modelrunner.scheduler.settings import ModelSettings, SettingsStore
from modelrunner.scheduler.warm import WarmResume

log = logging.getLogger(__name__)

DEFAULT_KEEP_ALIVE = 300.0
DEFAULT_FREEZE_TIMEOUT = 30.0
DEFAULT_QUEUE_TIMEOUT = 600.0
# A runner whose health route stays silent this long is frozen only if it also used less CPU than this
# share of one core meanwhile: a busy engine whose HTTP threads all serve long requests is not frozen.
FROZEN_CPU_SHARE = 0.05


class Busy(ModelRunnerError):
    """Too many requests are already waiting for a runner; the client should retry later."""

    status_code = 503
    retry_after = 5


class InsufficientMemory(ModelRunnerError):
    status_code = 507


def freeze_timeout_from_env() -> float:
    """`MODEL_RUNNER_FREEZE_TIMEOUT`: seconds an engine in use may leave its health route unanswered
    before it is declared frozen and ended (0 turns the watchdog off); 30 by default."""
    raw = os.environ.get("MODEL_RUNNER_FREEZE_TIMEOUT")
    if not raw:
        return DEFAULT_FREEZE_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"MODEL_RUNNER_FREEZE_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"MODEL_RUNNER_FREEZE_TIMEOUT must be 0 or a positive number, got {raw!r}")
    return value


def queue_timeout_from_env() -> float:
    """`MODEL_RUNNER_QUEUE_TIMEOUT`: seconds a request may wait in the queue for a runner (others hold the
    room it needs) before it is answered 503 with Retry-After; 0: no bound; 600 by default."""
    return env_seconds("MODEL_RUNNER_QUEUE_TIMEOUT", DEFAULT_QUEUE_TIMEOUT)


@dataclass
class SchedulerLimits:
    max_runners: int
    memory_budget: int
    max_waiting: int = 64
    default_keep_alive: float = DEFAULT_KEEP_ALIVE
    freeze_timeout: float = field(default_factory=freeze_timeout_from_env)
    queue_timeout: float = field(default_factory=queue_timeout_from_env)


@dataclass(eq=False)
class Waiter:
    """A request's place in the queue for a runner."""

    deadline: float  # the event loop's time at which its wait ends with a 503 (inf: never)


@dataclass
class Counters:
    loads: int = 0
    evictions: int = 0
    load_seconds_total: float = 0.0
    crashes: int = 0
    freezes: int = 0


def _background_context() -> contextvars.Context:
    """A context without the current request's id, for work that outlives the request."""
    context = contextvars.copy_context()
    context.run(eventlog.request_id.set, None)
    return context


class Scheduler:
    def __init__(
        self,
        engines: Mapping[str, Engine],
        settings: SettingsStore,
        run_dir: Path,
        logs_dir: Path,
        limits: SchedulerLimits,
        bundles: Callable[[str], Path] | None = None,
        warm: WarmResume | None = None,
    ) -> None:
        self.engines = engines
        self.warm = warm  # saves and restores runners' prompt caches (warm.py); None: never
        self.bundles = bundles  # model ID -> bundle folder, for draft models of speculative decoding
        self.settings = settings
        self.run_dir = run_dir
        self.logs_dir = logs_dir
        self.limits = limits
        self.runners: dict[RunnerKey, Runner] = {}
        self.stopping: dict[Runner, asyncio.Task[None]] = {}  # retired, not gone yet: their stop tasks
        # called with each runner as it is retired: the HTTP front closes its kept-alive connections to it
        # (an engine such as llama-server waits for its open connections before it exits)
        self.on_retire: list[Callable[[Runner], None]] = []
        self.counters = Counters()
        self.queue: list[Waiter] = []  # requests waiting for a runner, first come first served
        self.orphans_ended = 0
        self._changed = asyncio.Condition()
        self._closing = False
        self._next_slot = 0
        self._tasks: set[asyncio.Task[Any]] = set()  # every task the scheduler starts, until it ends
        rundir.ensure_private_dir(run_dir)  # UnsafeRuntimeDir when another user could reach into it

    @property
    def waiting(self) -> int:
        """How many requests wait in the queue."""
        return len(self.queue)

    def end_orphans(self) -> int:
        """End engines a killed predecessor left running. Only the daemon that holds the runner home's lock
        may call this (server/daemon.py), before it listens."""
        ended = end_orphans(self.run_dir / "pids")
        if self.warm is not None:
            self.warm.sweep()  # save folders of the engines just ended
        for record in ended:
            event(
                log,
                "orphan_ended",
                logging.WARNING,
                model=record.get("model"),
                engine=record.get("engine"),
                mode=record.get("mode"),
                pid=record.get("pid"),
                processes=record.get("processes"),
                signal="SIGKILL",
            )
        self.orphans_ended += len(ended)
        return len(ended)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], background: bool = True) -> asyncio.Task[Any]:
        """Start a task the scheduler owns (asyncio keeps only weak references to tasks): kept until it
        ends, cancelled at shutdown."""
        context = _background_context() if background else None
        task = asyncio.get_running_loop().create_task(coroutine, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- acquiring and releasing ------------------------------------------------------------------

    async def acquire(
        self, engine: Engine, model: ModelForEngine, mode: Mode, keep_alive: float | None = None
    ) -> Runner:
        """A ready runner for (engine, model, mode), loading it if needed; the caller must release it."""
        while True:
            runner = await self._acquire_once(engine, model, mode, keep_alive)
            if runner is not None:
                return runner

    async def _acquire_once(
        self, engine: Engine, model: ModelForEngine, mode: Mode, keep_alive: float | None
    ) -> Runner | None:
        """acquire(), or None when the load it waited for was replaced by one with new settings
        (`configure` while loading): the caller asks again and waits for the new one."""
        key = RunnerKey(engine.name, model.id, mode)
        place: Waiter | None = None  # its place in the queue, once it waits
        async with self._changed:
            try:
                while True:
                    if self._closing:
                        event(log, "refused", status=503, reason="shutting_down", model=model.reference)
                        raise Busy("the model runner is shutting down")
                    reason = "behind_others"
                    if not self.queue or self.queue[0] is place:  # nobody asked before it: its turn
                        runner, reason = self._runner_for(key, engine, model, mode)
                        if runner is not None:
                            break
                    if place is None:
                        place = self._join_queue(model, reason)
                    await self._wait_in_queue(place, model)
                self._hold(runner, keep_alive)
            finally:
                if place is not None:
                    self.queue.remove(place)
                    self._changed.notify_all()  # the next in line may go now
        assert runner.load_task is not None
        try:
            await asyncio.shield(runner.load_task)
        except asyncio.CancelledError:
            await self.release(runner)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this request was cancelled
            if runner.superseded:
                return None
            raise Busy("the model's load was cancelled (the model runner is stopping); retry") from None
        except BaseException:
            await self.release(runner)
            raise
        return runner

    def _runner_for(
        self, key: RunnerKey, engine: Engine, model: ModelForEngine, mode: Mode
    ) -> tuple[Runner | None, str]:
        """The runner of `key`, ready or loading, or one whose load starts now; None when there is no room
        for it yet (nothing is evicted then), with the reason."""
        runner = self.runners.get(key)
        if runner is not None and runner.state is RunnerState.DEFUNCT:
            self._retire(runner, "crashed", announce=False)
            runner = None
        if runner is not None and runner.state in (RunnerState.LOADING, RunnerState.READY):
            event(log, "reuse", model=runner.name, state=runner.state.value, pid=runner.pid)
            return runner, "reuse"
        runner = self._new_runner(key, engine, model, mode)
        try:
            victims = self._make_room(runner)
        except BaseException:
            self._discard(runner)
            raise
        if victims is None:
            self._discard(runner)  # no room yet: made afresh once there is
            return None, self._full_reason(runner.memory)
        self.runners[key] = runner
        # not a background task: the load's lines carry the id of the request that caused it
        runner.load_task = self._spawn(self._load(runner, victims), background=False)
        return runner, "load"

    def _join_queue(self, model: ModelForEngine, reason: str) -> Waiter:
        """A place at the end of the queue (FIFO across models: who asked first goes first, so a busy
        model cannot starve the others), or 503 when it is full."""
        if self.waiting >= self.limits.max_waiting:
            event(
                log,
                "refused",
                status=503,
                reason="queue_full",
                model=model.reference,
                waiting=self.waiting,
                max_waiting=self.limits.max_waiting,
            )
            raise Busy("too many requests are waiting for a model to load; retry later")
        timeout = self.limits.queue_timeout
        place = Waiter(asyncio.get_running_loop().time() + timeout if timeout else math.inf)
        self.queue.append(place)
        event(
            log,
            "queued",
            model=model.reference,
            position=self.waiting,
            reason=reason,
            loaded=len(self.runners),
            in_use=sum(1 for r in self.runners.values() if r.in_use),
        )
        return place

    async def _wait_in_queue(self, place: Waiter, model: ModelForEngine) -> None:
        """Until the scheduler changes; past the place's deadline (the queue timeout after it joined) the
        request is answered 503. A request whose client left is cancelled here, and leaves the queue."""
        if place.deadline == math.inf:
            await self._changed.wait()
            return
        timeout = self.limits.queue_timeout
        try:
            left = place.deadline - asyncio.get_running_loop().time()
            await asyncio.wait_for(self._changed.wait(), max(0.0, left))
        except TimeoutError:
            event(log, "refused", status=503, reason="queue_timeout", model=model.reference, seconds=timeout)
            raise Busy(
                f"waited {format_keep_alive(timeout)} for a runner while others were served; retry later "
                "(MODEL_RUNNER_QUEUE_TIMEOUT sets the wait)"
            ) from None

    def reuse(self, engine: str, model_id: str, mode: Mode, keep_alive: float | None = None) -> Runner | None:
        """acquire() of a runner that is ready, without waiting (the path of nearly every request): None
        when there is none, or when the scheduler is in the middle of a change (its lock is held); then
        acquire() decides (as it does while requests wait in the queue: none goes before them). The caller
        must release the runner it gets."""
        if self._closing or self._changed.locked() or self.queue:
            return None
        runner = self.runners.get(RunnerKey(engine, model_id, mode))
        if runner is None or runner.state is not RunnerState.READY:
            return None
        event(log, "reuse", soon=True, model=runner.name, state=runner.state.value, pid=runner.pid)
        self._hold(runner, keep_alive)
        return runner

    def serving(self, runner: Runner) -> bool:
        """Whether the runner is still in service (not retired: unloaded, evicted, crashed)."""
        return self.runners.get(runner.key) is runner

    def _hold(self, runner: Runner, keep_alive: float | None) -> None:
        runner.in_use += 1
        if runner.idle_timer:
            runner.idle_timer.cancel()
            runner.idle_timer = None
        if keep_alive is not None:
            runner.keep_alive = keep_alive

    def _new_runner(self, key: RunnerKey, engine: Engine, model: ModelForEngine, mode: Mode) -> Runner:
        stored = self.settings.get(engine.name, model.id, mode) or ModelSettings()
        settings = stored.runner_settings(self._draft_bundle(stored))
        self._next_slot += 1
        socket = self.run_dir / f"runner-{self._next_slot}.sock"
        spec = engine.launch_spec(model, mode, settings, socket)
        warm = None
        if self.warm is not None:
            spec, warm = self.warm.prepare(engine, model, mode, spec, stored.saves_prompt_cache)
        keep_alive = stored.keep_alive if stored.keep_alive is not None else self.limits.default_keep_alive
        # one engine log per (engine, model, mode): what a crash message quotes is that engine's own output
        log_path = self.logs_dir / f"engine-{engine.name}-{model.id.removeprefix('sha256:')[:12]}-{mode}.log"
        memory = engine.estimate_memory(model, settings)
        runner = Runner(key, model, spec, memory, log_path, self.run_dir / "pids", keep_alive)
        runner.settings = stored
        if self.warm is not None:
            self.warm.attach(runner, warm)
        return runner

    def _discard(self, runner: Runner) -> None:
        """A runner made but never started: what it was given (its save folder) goes."""
        if self.warm is not None:
            self.warm.release(runner)

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
        return sum(r.memory for r in self.runners.values()) + sum(r.memory for r in self.stopping)

    def _processes(self) -> int:
        return len(self.runners) + len(self.stopping)

    def _full_reason(self, needed: int) -> str:
        if self._processes() >= self.limits.max_runners:
            return "max_runners"
        if self._used_memory() + needed > self.limits.memory_budget:
            return "memory_budget"
        return "none"

    def _make_room(self, runner: Runner) -> list[Runner] | None:
        """Evict idle runners, least recently used first, so that `runner` fits once they are gone: the
        runners to wait for (maybe none), or None when it cannot fit yet (nothing is evicted then)."""
        needed = runner.memory
        if needed > self.limits.memory_budget:
            event(
                log,
                "refused",
                status=507,
                reason="larger_than_memory_budget",
                model=runner.name,
                needed=needed,
                memory_budget=self.limits.memory_budget,
            )
            raise InsufficientMemory(
                f"the model needs about {needed / 1e9:.2f} GB but the memory budget is "
                f"{self.limits.memory_budget / 1e9:.2f} GB; free memory or raise MODEL_RUNNER_MEMORY_BUDGET"
            )
        processes, used = self._processes(), self._used_memory()
        idle = sorted((r for r in self.runners.values() if r.in_use == 0), key=lambda r: r.last_used)
        chosen: list[tuple[Runner, str]] = []
        while idle and (processes >= self.limits.max_runners or used + needed > self.limits.memory_budget):
            victim = idle.pop(0)
            reason = "max_runners" if processes >= self.limits.max_runners else "memory_budget"
            chosen.append((victim, reason))
            processes -= 1
            used -= victim.memory
        if processes >= self.limits.max_runners or used + needed > self.limits.memory_budget:
            return None
        for victim, reason in chosen:
            self.counters.evictions += 1
            self._retire(
                victim,
                f"lru_{reason}",
                for_model=runner.name,
                idle_seconds=round(time.time() - victim.last_used, 1),
            )
        return [victim for victim, _ in chosen]

    def _retire(self, runner: Runner, reason: str, announce: bool = True, **fields: Any) -> asyncio.Task[Any]:
        """Take a runner out of service and stop its engine in the background; its memory counts until
        the engine is gone. Synchronous, so callers holding the lock stay atomic."""
        if self.runners.get(runner.key) is runner:
            del self.runners[runner.key]
        if runner.idle_timer:
            runner.idle_timer.cancel()
            runner.idle_timer = None
        if runner in self.stopping:
            return self.stopping[runner]
        if announce:
            event(log, "evict", reason=reason, **runner.describe(), **fields)
        for listener in self.on_retire:
            listener(runner)
        task = self.stopping[runner] = self._spawn(self._stop(runner, reason))
        return task

    async def _stop(self, runner: Runner, reason: str) -> None:
        started = time.monotonic()
        try:
            loading = runner.load_task
            if loading is not None and not loading.done() and reason != "load_failed":
                # its own clean-up stops the engine it may have spawned; cancelled again until it ends, as
                # Python 3.11's wait_for swallows a cancellation that meets its call's end (a health poll)
                while not loading.done():
                    loading.cancel()
                    await asyncio.wait({loading}, timeout=1)
                await asyncio.gather(loading, return_exceptions=True)
            if self.warm is not None and runner.state is RunnerState.READY and reason != "frozen":
                await self.warm.save(runner, self.engines[runner.key.engine])  # time-bound, never raises
            # a frozen engine would not act on SIGTERM: SIGKILL at once
            await runner.stop(grace=0 if reason == "frozen" else STOP_GRACE)
        finally:
            if self.warm is not None:
                self.warm.release(runner)
            async with self._changed:
                self.stopping.pop(runner, None)
                self._changed.notify_all()
        if runner.pid is not None:
            event(
                log,
                "stopped",
                model=runner.name,
                pid=runner.pid,
                status=runner.exit_status,
                seconds=round(time.monotonic() - started, 3),
            )

    async def _load(self, runner: Runner, victims: list[Runner]) -> None:
        try:
            if victims:
                await asyncio.gather(*(victim.gone.wait() for victim in victims))
            event(
                log,
                "load",
                model=runner.name,
                engine=runner.key.engine,
                mode=runner.key.mode.value,
                memory_estimate=runner.memory,
                command=shlex.join(runner.spec.argv),
            )
            await runner.start(self._restore_hook(runner))
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                event(log, "load_cancelled", model=runner.name, engine=runner.key.engine)
            else:
                message = exc.message if isinstance(exc, ModelRunnerError) else repr(exc)
                event(log, "load_failed", logging.ERROR, **runner.describe(), error=message[:2000])
            self._retire(runner, "load_failed", announce=False)
            async with self._changed:
                self._changed.notify_all()
            raise
        self.counters.loads += 1
        self.counters.load_seconds_total += runner.load_seconds
        event(log, "ready", **runner.describe(), load_seconds=round(runner.load_seconds, 3))
        self._spawn(self._supervise(runner))

    def _restore_hook(self, runner: Runner) -> Callable[[], Awaitable[bool]] | None:
        """What the runner does once its engine answers, before it takes traffic: restore its cache."""
        warm = self.warm
        if warm is None or runner not in warm.states:
            return None
        engine = self.engines[runner.key.engine]
        return lambda: warm.restore(runner, engine)

    async def _supervise(self, runner: Runner) -> None:
        """Watch a loaded runner: a crash makes it defunct (dropped when idle, reloaded by the next
        request); while requests wait on it, its health route is checked and an engine that stops answering
        (SIGSTOP, a deadlock) is ended, which fails those requests through the crash path."""
        timeout = self.limits.freeze_timeout
        interval = max(0.2, min(5.0, timeout / 4)) if timeout > 0 else None  # None: only watch for a crash
        last_answer, cpu_then = time.monotonic(), self._cpu(runner)
        warned = False
        while not runner.exited.is_set():
            if not await _wait(runner.exited, interval):
                continue  # it exited
            if runner.in_use == 0 or runner.state is not RunnerState.READY:
                last_answer, cpu_then, warned = time.monotonic(), self._cpu(runner), False
                continue
            assert interval is not None
            if await runner.answers_health(timeout=interval):
                last_answer, cpu_then, warned = time.monotonic(), self._cpu(runner), False
                continue
            silent = time.monotonic() - last_answer
            stat = process_stat(runner.pid) if runner.pid else None
            if silent < timeout or stat is None or runner.exited.is_set():
                continue
            state, _, cpu_now = stat
            if state not in "tT" and cpu_now - cpu_then >= FROZEN_CPU_SHARE * silent:
                if not warned:  # working hard but not answering: its HTTP threads may all be busy
                    warned = True
                    fields = runner.describe()
                    event(log, "engine_unresponsive", logging.WARNING, **fields, silent=round(silent))
                continue
            self.counters.freezes += 1
            event(
                log,
                "freeze",
                logging.ERROR,
                **runner.describe(),
                silent_seconds=round(silent, 1),
                process_state=state,
                in_use=runner.in_use,
                action="SIGKILL to the process group; the next request starts it again",
            )
            async with self._changed:
                self._retire(runner, "frozen", announce=False)
                self._changed.notify_all()
            return
        if runner.state is RunnerState.DEFUNCT:
            self.counters.crashes += 1
            fields = runner.describe()
            event(
                log,
                "crash",
                logging.ERROR,
                **fields,
                status=runner.exit_status,
                in_use=runner.in_use,
                reason=runner.error_tail(),
            )
            async with self._changed:
                if runner.in_use == 0 and self.runners.get(runner.key) is runner:
                    self._retire(runner, "crashed", announce=False)
                self._changed.notify_all()

    @staticmethod
    def _cpu(runner: Runner) -> float:
        stat = process_stat(runner.pid) if runner.pid else None
        return stat[2] if stat else 0.0

    async def release(self, runner: Runner) -> None:
        async with self._changed:
            self._release(runner)
            self._changed.notify_all()

    def release_nowait(self, runner: Runner) -> bool:
        """release() without waiting, when the scheduler is not in the middle of a change and no request
        waits for a runner (nobody to wake); False when release() must do it."""
        if self._changed.locked() or self.waiting:
            return False
        self._release(runner)
        return True

    def _release(self, runner: Runner) -> None:
        runner.in_use -= 1
        runner.last_used = time.time()
        current = self.runners.get(runner.key) is runner
        if runner.in_use == 0 and current:
            if runner.state is RunnerState.DEFUNCT:
                self._retire(runner, "crashed", announce=False)
            elif runner.keep_alive != NEVER and runner.state is RunnerState.READY:
                loop = asyncio.get_running_loop()
                runner.idle_timer = loop.call_later(
                    runner.keep_alive, self._on_idle, runner, context=_background_context()
                )

    def _on_idle(self, runner: Runner) -> None:
        runner.idle_timer = None
        self._spawn(self._expire(runner))

    async def _expire(self, runner: Runner) -> None:
        async with self._changed:
            if runner.in_use or self.runners.get(runner.key) is not runner:
                return
            self._retire(runner, "idle_timeout", keep_alive=format_keep_alive(runner.keep_alive))
            self._changed.notify_all()

    # -- admin ----------------------------------------------------------------------------------

    async def unload(
        self, model_ids: set[str] | None, engine: str | None = None, reason: str = "unload_request"
    ) -> int:
        """Stop idle runners of the given models (all when None), waiting until their engines are gone;
        in-use runners are left alone."""
        async with self._changed:
            victims = [
                r
                for r in self.runners.values()
                if r.in_use == 0
                and (model_ids is None or r.key.model_id in model_ids)
                and (engine is None or r.key.engine == engine)
            ]
            stops = [self._retire(runner, reason) for runner in victims]
            self._changed.notify_all()
        await asyncio.gather(*stops, return_exceptions=True)
        return len(victims)

    async def configure(self, engine: str, model_id: str, mode: Mode, settings: ModelSettings) -> None:
        """Store `settings` as the whole configuration of (engine, model, mode), as DMR's setRunnerConfig
        (pkg/inference/scheduling/loader.go): unchanged settings change nothing, the loaded runner stays;
        changed ones retire its runner when it is idle, or still loading (the requests waiting for it then
        load the new configuration), and are refused while it answers requests (DMR's 409)."""
        key = RunnerKey(engine, model_id, mode)
        stop: asyncio.Task[Any] | None = None
        async with self._changed:
            runner = self.runners.get(key)
            # what the loaded runner runs with (it may predate the stored settings: Ollama's num_ctx)
            current = runner.settings if runner is not None else self.settings.get(engine, model_id, mode)
            if settings != (current or ModelSettings()):
                if runner is not None and runner.state is RunnerState.READY and runner.in_use:
                    event(log, "refused", status=409, reason="runner_in_use", model=runner.name)
                    raise Conflict(
                        "runner already active: the model is answering requests with its current "
                        "configuration; configure it again when it is idle"
                    )
                if runner is not None:
                    runner.superseded = True
                    stop = self._retire(runner, "configure")
            self.settings.put(engine, model_id, mode, settings)
            self._changed.notify_all()
        if stop is not None:
            await asyncio.gather(stop, return_exceptions=True)

    def preload(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run a load that no request waits for (after `configure`) as a task the scheduler owns."""
        self._spawn(coroutine)

    def has_runner(self, engine: str, model_id: str, mode: Mode) -> bool:
        return RunnerKey(engine, model_id, mode) in self.runners

    def ps(self, draft_counts: Mapping[str, DraftCounts] | None = None) -> list[dict[str, Any]]:
        """Each runner's state; `draft_counts` by runner tag: the drafting runners' counts, read from
        their engines (server/admin_serving.py)."""
        counts = draft_counts or {}
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
                **({"drafting": _drafting(r.spec.drafting, counts.get(r.tag))} if r.spec.drafting else {}),
                **(self.warm.ps_fields(r) if self.warm is not None else {}),
            }
            for r in self.runners.values()
        ]

    async def shutdown(self, drain_seconds: float = 10.0) -> None:
        """Refuse new loads, let in-flight requests finish (bounded), stop every engine and wait until
        they are gone, then end every task the scheduler still owns."""
        async with self._changed:
            self._closing = True
            self._changed.notify_all()  # queued requests are answered "shutting down"
        deadline = time.monotonic() + drain_seconds
        while any(r.in_use for r in self.runners.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        async with self._changed:
            stops = [self._retire(runner, "shutdown") for runner in list(self.runners.values())]
        await asyncio.gather(*stops, return_exceptions=True)
        while self.stopping:  # retired earlier, still going
            await asyncio.gather(*list(self.stopping.values()), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # every engine is gone: its sockets and pid records with it; a record left (an engine that would not
        # end) keeps the folder for the next start's end_orphans
        for folder in (self.run_dir / "pids", self.run_dir):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _drafting(types: str, counts: DraftCounts | None) -> dict[str, Any]:
    """How a runner drafts for speculative decoding, and its tokens drafted and accepted when known."""
    return {"types": types, **(counts.to_api() if counts is not None else {})}


async def _wait(flag: asyncio.Event, seconds: float | None) -> bool:
    """Sleep `seconds` (None: for ever) unless `flag` is set first; True when the time passed."""
    try:
        await asyncio.wait_for(flag.wait(), seconds)
    except TimeoutError:
        return True
    return False


__all__ = ["Busy", "InsufficientMemory", "LoadError", "Scheduler", "SchedulerLimits"]
