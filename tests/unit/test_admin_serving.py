"""The scheduler routes' logic (server/admin_serving.py) called directly, without HTTP: runners as DMR's
BackendStatus, unload requests resolved or refused, the stored configurations and estimates."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from modelrunner.artifact.gojson import ZERO_TIME as GO_ZERO_TIME
from modelrunner.engines.base import Mode
from modelrunner.engines.registry import EngineRegistry
from modelrunner.errors import BadRequest, UnknownEngine
from modelrunner.scheduler.settings import ModelSettings
from modelrunner.server.admin_serving import AdminServing, UnloadRequest
from modelrunner.store.store import ModelStore
from tests.serving import FakeScheduler


def serving(store: ModelStore, scheduler: FakeScheduler, tmp_path: Path) -> AdminServing:
    return AdminServing(store, scheduler, EngineRegistry({}), tmp_path, None)  # type: ignore[arg-type]


def test_ps_says_last_used_as_go_writes_it(store: ModelStore, tmp_path: Path) -> None:
    running = [{"in_use": True, "last_used": 1.5}, {"in_use": False, "last_used": 1_700_000_000.25}]
    found = asyncio.run(serving(store, FakeScheduler(running), tmp_path).ps())
    assert [entry["last_used"] for entry in found] == [GO_ZERO_TIME, "2023-11-14T22:13:20.25Z"]


def test_unload_resolves_names_and_refuses_an_empty_request(
    store: ModelStore, tiny_model: str, tmp_path: Path
) -> None:
    scheduler = FakeScheduler()
    api = serving(store, scheduler, tmp_path)
    assert asyncio.run(api.unload(UnloadRequest(models=["tiny", "ai/tiny:latest", "gone"], backend=""))) == {
        "unloaded_runners": 1
    }
    assert asyncio.run(api.unload(UnloadRequest(all=True, backend="vllm"))) == {"unloaded_runners": 0}
    assert scheduler.unloaded == [({tiny_model}, None), (None, "vllm")]
    with pytest.raises(BadRequest, match="name the models to unload"):
        asyncio.run(api.unload(UnloadRequest(models=[])))
    assert len(scheduler.unloaded) == 2


def test_configuration_filtered_by_an_unknown_model_is_empty(
    store: ModelStore, tiny_model: str, tmp_path: Path
) -> None:
    scheduler = FakeScheduler()
    scheduler.settings.put("llama.cpp", tiny_model, Mode.COMPLETION, ModelSettings(context_size=512))
    api = serving(store, scheduler, tmp_path)
    [entry] = api.configuration(None)
    assert (entry["Backend"], entry["Model"], entry["Mode"]) == (
        "llama.cpp",
        "docker.io/ai/tiny:latest",
        "completion",
    )
    assert api.configuration("nope") == []


def test_estimate_refuses_an_unknown_backend_or_a_missing_engine(
    store: ModelStore, tiny_model: str, tmp_path: Path
) -> None:
    api = serving(store, FakeScheduler(), tmp_path)
    with pytest.raises(UnknownEngine, match="unknown backend"):
        api.estimate("ai/tiny", "nope")
    with pytest.raises(UnknownEngine, match="no engine is registered"):
        api.estimate("ai/tiny", None)
