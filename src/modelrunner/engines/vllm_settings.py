"""vLLM's own settings: the `vllm` object of DMR's configure request (BackendConfiguration's VLLMConfig:
`hf-overrides`, `gpu-memory-utilization`), plus ours (the parallel layout and the Ray cluster)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from modelrunner.engines import ray_cluster
from modelrunner.engines.settings import EngineSettings, is_number
from modelrunner.errors import BadRequest

NAME = "vllm"  # the engine's name, which the keys only it may set are checked against
_HF_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LAYOUT_KEYS = ("tensor-parallel-size", "pipeline-parallel-size", "ray-address")


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


@dataclass(frozen=True)
class VllmSettings(EngineSettings):
    key: ClassVar[str | None] = "vllm"

    hf_overrides: dict[str, Any] | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None  # None: 1
    pipeline_parallel_size: int | None = None  # None: 1
    ray_address: str | None = None  # the Ray cluster (else MODEL_RUNNER_RAY_ADDRESS)

    @classmethod
    def from_request(cls, value: Mapping[str, Any], engine: str) -> Self:
        overrides = value.get("hf-overrides")
        if overrides is not None:
            if not isinstance(overrides, dict):
                raise BadRequest("hf-overrides must be a JSON object")
            check_hf_overrides(overrides)
        utilisation = value.get("gpu-memory-utilization")
        if utilisation is not None and not (is_number(utilisation, int | float) and 0 < utilisation <= 1):
            raise BadRequest("gpu-memory-utilization must be a number in (0, 1]")
        return cls(
            hf_overrides=overrides,
            gpu_memory_utilization=None if utilisation is None else float(utilisation),
            **_layout(value, engine),
        )

    def configuration(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.hf_overrides:
            out["hf-overrides"] = self.hf_overrides
        if self.gpu_memory_utilization is not None:
            out["gpu-memory-utilization"] = self.gpu_memory_utilization
        if self.tensor_parallel_size is not None:
            out["tensor-parallel-size"] = self.tensor_parallel_size
        if self.pipeline_parallel_size is not None:
            out["pipeline-parallel-size"] = self.pipeline_parallel_size
        if self.ray_address:
            out["ray-address"] = self.ray_address
        return out


def _layout(value: Mapping[str, Any], engine: str) -> dict[str, Any]:
    """`tensor-parallel-size`, `pipeline-parallel-size`, `ray-address`: 1, 1 and "" are the defaults."""
    keys = [key for key in _LAYOUT_KEYS if key in value]
    if keys and engine != NAME:
        raise BadRequest(f"{keys[0]} is a vLLM setting, and this model runs on {engine}")
    out: dict[str, Any] = {}
    for key in ("tensor-parallel-size", "pipeline-parallel-size"):
        if key in value:
            size = value[key]
            if not (is_number(size, int) and 1 <= size <= 1024):
                raise BadRequest(f"{key} must be a number of workers from 1 to 1024")
            out[key.replace("-", "_")] = None if size == 1 else size
    if "ray-address" in value:
        address = value["ray-address"]
        if not isinstance(address, str):
            raise BadRequest("ray-address must be HOST:PORT of the Ray cluster's head")
        out["ray_address"] = ray_cluster.parse_address(address) if address.strip() else None
    return out
