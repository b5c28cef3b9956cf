"""llama.cpp's own settings: the `llamacpp` object of DMR's configure request (BackendConfiguration's
LlamaCppConfig: `reasoning-budget`), plus ours (`rpc` workers, `kv-persist`, `draft-from-context`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from modelrunner.engines import llamacpp_drafting, rpc_workers
from modelrunner.engines.settings import EngineSettings, is_number
from modelrunner.errors import BadRequest

NAME = "llama.cpp"  # the engine's name, which the keys only it may set are checked against


@dataclass(frozen=True)
class LlamaCppSettings(EngineSettings):
    key: ClassVar[str | None] = "llamacpp"

    reasoning_budget: int | None = None
    rpc_workers: tuple[str, ...] = ()  # llama.cpp RPC workers, HOST:PORT
    kv_persist: bool | None = None  # warm resume: save/restore the prompt cache (None: on)
    draft_from_context: str | None = None  # an n-gram drafting type (engines/llamacpp_drafting.py)

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
        drafting = _draft_from_context(value.get("draft-from-context", False), engine)
        return cls(
            reasoning_budget=budget,
            rpc_workers=workers,
            kv_persist=None if persist else False,
            draft_from_context=drafting,
        )

    def configuration(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.reasoning_budget is not None:
            out["reasoning-budget"] = self.reasoning_budget
        if self.rpc_workers:
            out["rpc"] = ",".join(self.rpc_workers)
        if self.kv_persist is False:
            out["kv-persist"] = False
        if self.draft_from_context is not None:
            out["draft-from-context"] = self.draft_from_context
        return out

    @property
    def saves_prompt_cache(self) -> bool:
        return self.kv_persist is not False


def _draft_from_context(value: object, engine: str) -> str | None:
    """`draft-from-context`: true (the default n-gram type), one of the types by name, or false (off)."""
    if value is False or value is None:
        return None
    if engine != NAME:
        raise BadRequest("draft-from-context is a llama.cpp setting, and this model runs on " + engine)
    if value is True:
        return llamacpp_drafting.DEFAULT_TYPE
    if isinstance(value, str) and value in llamacpp_drafting.CONTEXT_TYPES:
        return value
    types = ", ".join(llamacpp_drafting.CONTEXT_TYPES)
    raise BadRequest(f"draft-from-context must be true, false or one of {types}")
