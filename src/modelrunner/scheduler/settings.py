"""Per-model runner settings from `model configure`, persisted in the store so they survive restarts.

DMR keeps them in memory only, and its users lose their context size on every restart (its most
reported bug). Here each model has `configs/<model-hex>.json` next to the models index:
{"<backend>/<mode>": {...settings...}}, written atomically. Each `configure` replaces the entry as a whole,
as DMR's does: what a request leaves out is back to its default.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from modelrunner.digest import validate_digest
from modelrunner.engines.base import Mode, RunnerSettings
from modelrunner.engines.registry import configuration_types
from modelrunner.engines.settings import EngineSettings, S, settings_of
from modelrunner.fileio import write_file_atomic
from modelrunner.scheduler.durations import format_keep_alive


@dataclass
class ModelSettings:
    """What `configure` stores for one (backend, model, mode): the settings every engine reads, and the
    engines' own (each engine's `settings_type`: only those that are set, in registry order)."""

    context_size: int | None = None
    runtime_flags: list[str] = field(default_factory=list)
    keep_alive: float | None = None  # seconds; inf = never; None = the daemon's default
    speculative_draft_model: str | None = None  # a model ID
    speculative_num_tokens: int | None = None
    speculative_min_acceptance_rate: float | None = None
    engines: tuple[EngineSettings, ...] = ()

    def of(self, kind: type[S]) -> S:
        return settings_of(self.engines, kind)

    @property
    def saves_prompt_cache(self) -> bool:
        """Warm resume: whether the runner's prompt cache is saved and restored (on unless turned off)."""
        return all(own.saves_prompt_cache for own in self.engines)

    def runner_settings(self, draft_bundle: Path | None = None) -> RunnerSettings:
        return RunnerSettings(
            context_size=self.context_size,
            runtime_flags=tuple(self.runtime_flags),
            draft_bundle=draft_bundle,
            draft_tokens=self.speculative_num_tokens,
            draft_min_probability=self.speculative_min_acceptance_rate,
            engines=self.engines,
        )

    def to_json(self) -> dict[str, Any]:
        """Flat: the common fields and each engine's own by name (as the file has always been written)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "engines"}
        if data["keep_alive"] == float("inf"):
            data["keep_alive"] = -1
        for own in self.engines:
            data.update(own.to_json())
        return {k: v for k, v in data.items() if v not in (None, [])}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSettings:
        """A stored entry; each engine's settings type takes its own keys (unknown keys are skipped)."""
        common = {f.name for f in fields(cls)} - {"engines"}
        settings = cls(**{k: v for k, v in data.items() if k in common})
        if settings.keep_alive is not None and settings.keep_alive < 0:
            settings.keep_alive = float("inf")
        settings.engines = _set_only(kind.from_json(data) for kind in configuration_types())
        return settings


def engine_settings_from_request(objects: Mapping[str, Any], engine: str) -> tuple[EngineSettings, ...]:
    """The engines' objects of a configure request (`llamacpp`, `vllm`, ... by key), each read and checked
    by its engine's settings type; `engine`: the engine that runs the model. An object no engine owns, and
    an empty one, set nothing."""
    return _set_only(
        kind.from_request(objects[kind.key], engine)
        for kind in configuration_types()
        if kind.key is not None and objects.get(kind.key)
    )


def _set_only(found: Iterable[EngineSettings]) -> tuple[EngineSettings, ...]:
    """Only the settings that differ from their defaults: what an unset object and none compare equal."""
    return tuple(own for own in found if not own.is_default)


# DMR's BackendConfiguration (pkg/inference/backend.go) writes its engines' objects in this order.
_DMR_OBJECT_ORDER = ("vllm", "llamacpp")


def backend_configuration(settings: ModelSettings, draft_name: str | None = None) -> dict[str, Any]:
    """Settings as DMR's BackendConfiguration (pkg/inference/backend.go): its keys, its order, unset fields
    left out (`omitempty`), keep_alive in Go's duration format; then each engine's object as its settings
    type writes it (ours, as RPC workers or vLLM's parallel layout, among DMR's keys). `draft_name`: how to
    name the speculative draft model (its ID otherwise)."""
    out: dict[str, Any] = {}
    if settings.context_size is not None:
        out["context-size"] = settings.context_size
    if settings.runtime_flags:
        out["runtime-flags"] = list(settings.runtime_flags)
    if settings.speculative_draft_model:
        speculative: dict[str, Any] = {"draft_model": draft_name or settings.speculative_draft_model}
        if settings.speculative_num_tokens:
            speculative["num_tokens"] = settings.speculative_num_tokens
        if settings.speculative_min_acceptance_rate:
            speculative["min_acceptance_rate"] = settings.speculative_min_acceptance_rate
        out["speculative"] = speculative
    if settings.keep_alive is not None:
        out["keep_alive"] = format_keep_alive(settings.keep_alive)
    ranked = sorted(settings.engines, key=lambda own: _rank(own.key))
    for own in ranked:
        written = own.configuration()
        if own.key is not None and written:
            out[own.key] = written
    return out


def _rank(key: str | None) -> int:
    return _DMR_OBJECT_ORDER.index(key) if key in _DMR_OBJECT_ORDER else len(_DMR_OBJECT_ORDER)


class SettingsStore:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _path(self, model_id: str) -> Path:
        return self.folder / (validate_digest(model_id).removeprefix("sha256:") + ".json")

    def _read(self, model_id: str) -> dict[str, Any]:
        try:
            data = json.loads(self._path(model_id).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, backend: str, model_id: str, mode: Mode) -> ModelSettings | None:
        """The stored settings; reranking and image loads fall back to the completion settings (as DMR)."""
        data = self._read(model_id)
        raw = data.get(f"{backend}/{mode.value}")
        if raw is None and mode in (Mode.RERANKING, Mode.IMAGE_GENERATION):
            raw = data.get(f"{backend}/{Mode.COMPLETION.value}")
        return ModelSettings.from_json(raw) if isinstance(raw, dict) else None

    def put(self, backend: str, model_id: str, mode: Mode, settings: ModelSettings) -> None:
        with self._lock:
            data = self._read(model_id)
            data[f"{backend}/{mode.value}"] = settings.to_json()
            write_file_atomic(self._path(model_id), json.dumps(data, indent=2).encode())

    def clear(self, model_id: str) -> None:
        with self._lock:
            self._path(model_id).unlink(missing_ok=True)

    def all(self) -> list[tuple[str, str, Mode, ModelSettings]]:
        """(backend, model_id, mode, settings) for every stored configuration."""
        out = []
        for path in sorted(self.folder.glob("*.json")):
            model_id = "sha256:" + path.stem
            for key, raw in self._read(model_id).items():
                backend, _, mode = key.rpartition("/")
                if isinstance(raw, dict) and mode in Mode._value2member_map_:
                    out.append((backend, model_id, Mode(mode), ModelSettings.from_json(raw)))
        return out
