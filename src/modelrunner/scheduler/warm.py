"""Warm resume: a runner's prompt cache outlives its engine.

The scheduler calls `prepare` when it makes a completion runner (the engine gets a save folder of its own),
`restore` once the engine is ready and before it takes traffic, `save` before it stops a ready engine (idle
expiry, eviction, unload, configure, shutdown all stop through Scheduler._stop), and `release` when the
engine is gone. Saved slots live in the store (kv_persist.py) under a fingerprint of the model and the
engine's run, so a cache is only ever restored into an engine it is valid for.

A load of a fingerprint whose save is still being written (its previous runner stopped on idle or for an
eviction a moment before) waits for that save, at most SAVE_BOUND, then restores it: the engine starts
meanwhile, so only what remains of the save is waited for.

Never wrong, never stuck: each engine call is time-bound (a stuck engine delays its stop by at most
SAVE_BOUND); a restore is checked before the runner takes traffic by sending each slot its saved tokens
back (Engine.probe_slot): all but the last must come from the cache. A restore the engine refuses, one that
brings back fewer tokens than were saved, or one the check finds unused (a no-op, llama.cpp#26676) drops the
entry and has the scheduler restart the engine clean, as a failed restore may leave it corrupt
(llama.cpp#27052). Models the engine cannot restore whole are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from modelrunner.engines.base import Engine, LaunchSpec, Mode, ModelForEngine, SlotError
from modelrunner.eventlog import event
from modelrunner.scheduler.kv_persist import WORK, KvStore, fingerprint
from modelrunner.scheduler.runner import Runner

log = logging.getLogger(__name__)

CALL_TIMEOUT = 30.0  # one save or restore call to the engine
SAVE_BOUND = 30.0  # all of a runner's saves: the most a save may delay a stop
RESULTS = ("hit", "miss", "error")  # modelrunner_kv_restore_total{result}; miss: restored, yet not used


class RestoreMiss(SlotError):
    """The engine took the restore, but the check found the restored cache unused."""


@dataclass
class WarmState:
    """A runner's warm-resume state, shown by `ps`."""

    fingerprint: str
    folder: Path
    status: str = "cold"  # cold | restored | restore_failed
    tokens: int = 0  # restored
    restored_at: float = 0.0


@dataclass
class WarmCounters:
    restores: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0))
    restore_seconds: float = 0.0
    restore_bytes: int = 0
    saves: int = 0
    save_seconds: float = 0.0
    save_bytes: int = 0


class WarmResume:
    def __init__(self, kv: KvStore) -> None:
        self.kv = kv
        self.states: dict[Runner, WarmState] = {}
        self.counters = WarmCounters()
        self.saving: dict[str, asyncio.Event] = {}  # fingerprints whose save is being written: set when done

    def prepare(
        self, engine: Engine, model: ModelForEngine, mode: Mode, spec: LaunchSpec, enabled: bool
    ) -> tuple[LaunchSpec, WarmState | None]:
        """`spec` made to save into a folder of its own, and its state; (spec, None) when this runner's
        cache is not kept (turned off, not a completion runner, or the engine cannot: logged)."""
        if not enabled or mode is not Mode.COMPLETION:
            return spec, None
        try:
            fp = fingerprint(model.id, engine.kv_identity(model, spec))
            folder = self.kv.work_area(uuid.uuid4().hex)
            return engine.with_slot_folder(spec, folder), WarmState(fp, folder)
        except SlotError as exc:
            event(log, "kv_persist_skipped", model=model.reference, engine=engine.name, reason=str(exc))
            return spec, None

    def attach(self, runner: Runner, state: WarmState | None) -> None:
        if state is not None:
            self.states[runner] = state

    async def restore(self, runner: Runner, engine: Engine) -> bool:
        """Restore the slots saved under the runner's fingerprint, if any; False when the engine must be
        restarted clean (the entry is dropped then)."""
        state = self.states.get(runner)
        if state is None:
            return True
        await self._saved(runner, state.fingerprint)
        entry = await asyncio.to_thread(self.kv.entry, runner.model.id, state.fingerprint)
        if entry is None:
            return True
        started = time.monotonic()
        tokens = 0
        try:
            await asyncio.to_thread(self.kv.link_into, entry, state.folder)
            for slot in entry.slots:
                tokens += await engine.restore_slot(runner.socket, slot, CALL_TIMEOUT)
            for slot in entry.slots:
                cached = await engine.probe_slot(runner.socket, slot, CALL_TIMEOUT)
                if cached < slot.tokens - 1:  # the engine evaluates the last token again in any case
                    raise RestoreMiss(
                        f"slot {slot.slot}: {cached} of its {slot.tokens} tokens came from the cache"
                    )
        except (SlotError, OSError) as exc:
            result = "miss" if isinstance(exc, RestoreMiss) else "error"
            self.counters.restores[result] += 1
            state.status = "restore_failed"
            event(
                log,
                "kv_restore_failed",
                logging.WARNING,
                **runner.describe(),
                result=result,
                reason=str(exc)[:500],
                action="entry dropped; the engine restarts clean",
            )
            await asyncio.to_thread(self.kv.drop, runner.model.id, state.fingerprint, "restore_failed")
            return False
        finally:
            for slot in entry.slots:  # the engine read them; the entry keeps its own links
                (state.folder / slot.filename).unlink(missing_ok=True)
        seconds = time.monotonic() - started
        self.counters.restores["hit"] += 1
        self.counters.restore_seconds += seconds
        self.counters.restore_bytes += entry.size
        state.status, state.tokens, state.restored_at = "restored", tokens, time.time()
        await asyncio.to_thread(self.kv.touch, entry)
        event(
            log,
            "kv_restored",
            **runner.describe(),
            slots=len(entry.slots),
            tokens=tokens,
            bytes=entry.size,
            seconds=round(seconds, 3),
        )
        return True

    async def _saved(self, runner: Runner, fp: str) -> None:
        """Wait for a save of `fp` still being written, so that this runner restores it (save() itself is
        bounded by SAVE_BOUND; so is this wait)."""
        pending = self.saving.get(fp)
        if pending is None:
            return
        event(log, "kv_restore_waits_for_save", **runner.describe(), fingerprint=fp[:12])
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SAVE_BOUND):
                await pending.wait()

    def restarted(self, runner: Runner) -> None:
        """The engine was restarted clean after a failed restore: it starts cold."""
        state = self.states.get(runner)
        if state is not None:
            state.tokens = 0

    async def save(self, runner: Runner, engine: Engine) -> None:
        """Save the slots of a ready engine about to stop, within SAVE_BOUND seconds; failures are logged,
        never raised (the engine stops all the same)."""
        state = self.states.get(runner)
        if state is None or (state.status == "restored" and runner.last_used < state.restored_at):
            return  # nothing to save, or nothing new since the restore
        started = time.monotonic()
        done = self.saving[state.fingerprint] = asyncio.Event()  # before any await: a load now waits
        try:
            async with asyncio.timeout(SAVE_BOUND):
                slots = await engine.save_slots(runner.socket, state.folder, CALL_TIMEOUT)
                entry = await asyncio.to_thread(
                    self.kv.commit, runner.model.id, state.fingerprint, state.folder, slots
                )
        except (SlotError, OSError, TimeoutError) as exc:
            event(log, "kv_save_failed", logging.WARNING, **runner.describe(), reason=str(exc)[:500])
            return
        finally:
            done.set()
            if self.saving.get(state.fingerprint) is done:
                del self.saving[state.fingerprint]
        if entry is None:
            return
        seconds = time.monotonic() - started
        self.counters.saves += 1
        self.counters.save_seconds += seconds
        self.counters.save_bytes += entry.size
        event(
            log,
            "kv_saved",
            **runner.describe(),
            slots=len(entry.slots),
            tokens=sum(slot.tokens for slot in entry.slots),
            bytes=entry.size,
            seconds=round(seconds, 3),
        )

    def release(self, runner: Runner) -> None:
        """The engine is gone: its save folder goes."""
        state = self.states.pop(runner, None)
        if state is not None and state.folder.parent.name == WORK:
            shutil.rmtree(state.folder, ignore_errors=True)

    def ps_fields(self, runner: Runner) -> dict[str, object]:
        state = self.states.get(runner)
        if state is None:
            return {}
        return {"warm": {"state": state.status, "restored_tokens": state.tokens}}

    def sweep(self) -> None:
        with contextlib.suppress(OSError):
            self.kv.sweep()


def warm_metrics(counters: WarmCounters) -> list[str]:
    """Prometheus lines of warm resume: restores by result, bytes and seconds of restores and saves."""
    lines = [
        "# HELP modelrunner_kv_restore_total Prompt-cache restores into a starting runner, by result.",
        "# TYPE modelrunner_kv_restore_total counter",
        *(f'modelrunner_kv_restore_total{{result="{r}"}} {n}' for r, n in counters.restores.items()),
    ]
    for name, what, value in (
        ("kv_restore_bytes_total", "Bytes of prompt cache restored.", counters.restore_bytes),
        ("kv_restore_seconds_total", "Seconds spent restoring prompt caches.", counters.restore_seconds),
        ("kv_save_total", "Prompt caches saved before a runner stopped.", counters.saves),
        ("kv_save_bytes_total", "Bytes of prompt cache saved.", counters.save_bytes),
        ("kv_save_seconds_total", "Seconds spent saving prompt caches.", counters.save_seconds),
    ):
        lines += [f"# HELP modelrunner_{name} {what}", f"# TYPE modelrunner_{name} counter"]
        lines.append(
            f"modelrunner_{name} {value:.6f}" if isinstance(value, float) else f"modelrunner_{name} {value}"
        )
    return lines
