"""llama.cpp's own settings: the `llamacpp` object of DMR's configure request (BackendConfiguration's
LlamaCppConfig: `reasoning-budget`), plus ours (`rpc` workers, `kv-persist`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from modelrunner.engines import rpc_workers
from modelrunner.engines.settings import EngineSettings, is_number
from modelrunner.errors import BadRequest

NAME = "llama.cpp"  # the engine's name, which the keys only it may set are checked against


@dataclass(frozen=True)
class LlamaCppSettings(EngineSettings):
    key: ClassVar[str | None] = "llamacpp"

    reasoning_budget: int | None = None
    rpc_workers: tuple[str, ...] = ()  # llama.cpp RPC workers, HOST:PORT
    kv_persist: bool | None = None  # warm resume: save/restore the prompt cache (None: on)

    @classmethod
    def from_request(cls, value: Mapping[str, Any], engine: str) -> Self:
        workers: tuple[str, ...] = ()
        if "rpc" in value:  # RPC workers: [] or "" turns them off
            if engine != NAME:
                raise BadRequest("rpc workers are a llama.cpp setting, and this model runs on " + engine)
            workers = tuple(rpc_workers.parse_workers(value["rpc"]))
        budget: int | None = None
        if "reasoning-budget" in value:
            budget = value["reasoning-budget"]
            if not (is_number(budget, int) and -1 <= budget <= 2**31 - 1):
                raise BadRequest("reasoning-budget must be -1 (unlimited), 0 (off) or a number of tokens")
        persist = value.get("kv-persist", True)
        if not isinstance(persist, bool):
            raise BadRequest("kv-persist must be true or false")
        return cls(reasoning_budget=budget, rpc_workers=workers, kv_persist=None if persist else False)

    def configuration(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.reasoning_budget is not None:
            out["reasoning-budget"] = self.reasoning_budget
        if self.rpc_workers:
            out["rpc"] = ",".join(self.rpc_workers)
        if self.kv_persist is False:
            out["kv-persist"] = False
        return out

    @property
    def saves_prompt_cache(self) -> bool:
        return self.kv_persist is not False
