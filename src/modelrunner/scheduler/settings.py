"""Per-model runner settings from `model configure`, persisted in the store so they survive restarts.

DMR keeps them in memory only, and its users lose their context size on every restart (its most
reported bug). Here each model has `configs/<model-hex>.json` next to the models index:
{"<backend>/<mode>": {...settings...}}, written atomically. Each `configure` replaces the entry as a whole,
as DMR's does: what a request leaves out is back to its default.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from modelrunner.engines.base import Mode, RunnerSettings
from modelrunner.fileio import write_file_atomic
from modelrunner.reference import validate_digest
from modelrunner.scheduler.durations import format_keep_alive


@dataclass
class ModelSettings:
    """What `configure` stores for one (backend, model, mode)."""

    context_size: int | None = None
    runtime_flags: list[str] = field(default_factory=list)
    reasoning_budget: int | None = None
    keep_alive: float | None = None  # seconds; inf = never; None = the daemon's default
    hf_overrides: dict[str, Any] | None = None
    gpu_memory_utilization: float | None = None
    speculative_draft_model: str | None = None  # a model ID
    speculative_num_tokens: int | None = None
    speculative_min_acceptance_rate: float | None = None
    rpc_workers: list[str] = field(default_factory=list)  # llama.cpp RPC workers, HOST:PORT
    tensor_parallel_size: int | None = None  # vLLM
    pipeline_parallel_size: int | None = None  # vLLM
    ray_address: str | None = None  # vLLM: the Ray cluster (else MODEL_RUNNER_RAY_ADDRESS)
    kv_persist: bool | None = None  # warm resume: save/restore the prompt cache (None: on)

    def runner_settings(self, draft_bundle: Path | None = None) -> RunnerSettings:
        return RunnerSettings(
            context_size=self.context_size,
            runtime_flags=tuple(self.runtime_flags),
            reasoning_budget=self.reasoning_budget,
            hf_overrides=self.hf_overrides,
            gpu_memory_utilization=self.gpu_memory_utilization,
            draft_bundle=draft_bundle,
            draft_tokens=self.speculative_num_tokens,
            draft_min_probability=self.speculative_min_acceptance_rate,
            rpc_workers=tuple(self.rpc_workers),
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            ray_address=self.ray_address,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if data["keep_alive"] == float("inf"):
            data["keep_alive"] = -1
        return {k: v for k, v in data.items() if v not in (None, [])}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSettings:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        settings = cls(**known)
        if settings.keep_alive is not None and settings.keep_alive < 0:
            settings.keep_alive = float("inf")
        return settings


def backend_configuration(settings: ModelSettings, draft_name: str | None = None) -> dict[str, Any]:
    """Settings as DMR's BackendConfiguration (pkg/inference/backend.go): its keys, its order, unset fields
    left out (`omitempty`), keep_alive in Go's duration format; then ours (RPC workers, vLLM's parallel
    layout and Ray address) in the objects where DMR keeps each engine's settings. `draft_name`: how to name
    the speculative draft model (its ID otherwise)."""
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
    vllm: dict[str, Any] = {}
    if settings.hf_overrides:
        vllm["hf-overrides"] = settings.hf_overrides
    if settings.gpu_memory_utilization is not None:
        vllm["gpu-memory-utilization"] = settings.gpu_memory_utilization
    if settings.tensor_parallel_size is not None:
        vllm["tensor-parallel-size"] = settings.tensor_parallel_size
    if settings.pipeline_parallel_size is not None:
        vllm["pipeline-parallel-size"] = settings.pipeline_parallel_size
    if settings.ray_address:
        vllm["ray-address"] = settings.ray_address
    if vllm:
        out["vllm"] = vllm
    llamacpp: dict[str, Any] = {}
    if settings.reasoning_budget is not None:
        llamacpp["reasoning-budget"] = settings.reasoning_budget
    if settings.rpc_workers:
        llamacpp["rpc"] = ",".join(settings.rpc_workers)
    if settings.kv_persist is False:
        llamacpp["kv-persist"] = False
    if llamacpp:
        out["llamacpp"] = llamacpp
    return out


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
