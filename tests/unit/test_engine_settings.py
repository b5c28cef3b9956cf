"""Each engine owns its settings (`Engine.settings_type`): the `llamacpp` and `vllm` objects of a configure
request are read by the engine's type, stored flat in `configs/<model-hex>.json` as they always were, and
written back in DMR's BackendConfiguration shape (pkg/inference/backend.go: VLLM before LlamaCpp)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import ValidationError

import modelrunner.server.admin_api
import modelrunner.server.capabilities
import modelrunner.server.ollama_serving
from modelrunner.engines.base import Engine, Mode
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.engines.llamacpp_settings import LlamaCppSettings
from modelrunner.engines.registry import configuration_types, default_registry
from modelrunner.engines.settings import EngineSettings
from modelrunner.engines.vllm import VllmEngine
from modelrunner.engines.vllm_settings import VllmSettings
from modelrunner.errors import BadRequest, ModelNotFound
from modelrunner.scheduler.settings import ModelSettings, SettingsStore, backend_configuration
from modelrunner.server.admin_api import ConfigureRequest, settings_from_request
from modelrunner.store.store import ModelStore

ID = "sha256:" + "d" * 64
DRAFT = "sha256:" + "e" * 64

# What the code before engines owned their settings wrote (its SettingsStore.put, verbatim): one flat object
# per (backend, mode), the engines' fields among the common ones.
WRITTEN_BEFORE = """{
  "llama.cpp/completion": {
    "context_size": 4096,
    "runtime_flags": [
      "--threads",
      "2"
    ],
    "reasoning_budget": 0,
    "keep_alive": -1,
    "hf_overrides": {
      "max_position_embeddings": 1024
    },
    "speculative_draft_model": "DRAFT",
    "speculative_num_tokens": 4,
    "rpc_workers": [
      "10.0.0.2:50052"
    ],
    "kv_persist": false
  },
  "vllm/completion": {
    "keep_alive": 300.0,
    "gpu_memory_utilization": 0.5,
    "tensor_parallel_size": 2,
    "ray_address": "10.0.0.1:6379"
  }
}""".replace("DRAFT", DRAFT)


class _Engine:
    def __init__(self, name: str) -> None:
        self.name = name

    def validate_runtime_flags(self, flags: list[str]) -> None:
        return None


def configure(engine: str, **body: Any) -> ModelSettings:
    request = ConfigureRequest.model_validate({"model": "ai/x", **body})
    return settings_from_request(request, None, _Engine(engine), None)  # type: ignore[arg-type]


def test_a_configuration_file_written_before_loads_into_the_engines_settings(tmp_path: Path) -> None:
    (tmp_path / (ID[7:] + ".json")).write_text(WRITTEN_BEFORE)
    store = SettingsStore(tmp_path)
    llama = store.get("llama.cpp", ID, Mode.COMPLETION)
    assert llama is not None
    assert (llama.context_size, llama.runtime_flags, llama.keep_alive) == (
        4096,
        ["--threads", "2"],
        float("inf"),
    )
    assert llama.engines == (
        LlamaCppSettings(reasoning_budget=0, rpc_workers=("10.0.0.2:50052",), kv_persist=False),
        VllmSettings(hf_overrides={"max_position_embeddings": 1024}),
    )
    assert not llama.saves_prompt_cache
    runner = llama.runner_settings()
    assert runner.of(LlamaCppSettings).rpc_workers == ("10.0.0.2:50052",)
    assert runner.of(VllmSettings).hf_overrides == {"max_position_embeddings": 1024}
    vllm = store.get("vllm", ID, Mode.COMPLETION)
    assert vllm is not None and vllm.of(LlamaCppSettings) == LlamaCppSettings() and vllm.saves_prompt_cache
    assert vllm.of(VllmSettings) == VllmSettings(
        gpu_memory_utilization=0.5, tensor_parallel_size=2, ray_address="10.0.0.1:6379"
    )
    # the answers of `configure show`, as before, to the byte
    assert json.dumps(backend_configuration(llama)) == (
        '{"context-size": 4096, "runtime-flags": ["--threads", "2"], "speculative": {"draft_model": '
        f'"{DRAFT}", "num_tokens": 4}}, "keep_alive": "-1", "vllm": {{"hf-overrides": '
        '{"max_position_embeddings": 1024}}, "llamacpp": {"reasoning-budget": 0, "rpc": "10.0.0.2:50052", '
        '"kv-persist": false}}'
    )
    assert json.dumps(backend_configuration(vllm)) == (
        '{"keep_alive": "5m0s", "vllm": {"gpu-memory-utilization": 0.5, "tensor-parallel-size": 2, '
        '"ray-address": "10.0.0.1:6379"}}'
    )
    # written again: the same keys and values (flat, the engines' fields by name)
    before = json.loads(WRITTEN_BEFORE)
    store.put("llama.cpp", ID, Mode.COMPLETION, llama)
    store.put("vllm", ID, Mode.COMPLETION, vllm)
    assert json.loads((tmp_path / (ID[7:] + ".json")).read_text()) == before


def test_each_engine_reads_its_own_object_whatever_runs_the_model() -> None:
    """DMR keeps both objects in every configuration: a `vllm` object for a llama.cpp model is checked and
    kept (and the other way round), but the keys that only one engine can act on are refused elsewhere."""
    llama = configure("llama.cpp", vllm={"hf-overrides": {"a": 1}, "gpu-memory-utilization": 0.5})
    assert llama.engines == (VllmSettings(hf_overrides={"a": 1}, gpu_memory_utilization=0.5),)
    assert backend_configuration(llama) == {"vllm": {"hf-overrides": {"a": 1}, "gpu-memory-utilization": 0.5}}
    on_vllm = configure("vllm", llamacpp={"reasoning-budget": 0, "kv-persist": False})
    assert on_vllm.engines == (LlamaCppSettings(reasoning_budget=0, kv_persist=False),)
    with pytest.raises(
        BadRequest, match="pipeline-parallel-size is a vLLM setting, and this model runs on llama"
    ):
        configure("llama.cpp", vllm={"pipeline-parallel-size": 2})
    with pytest.raises(
        BadRequest, match=r"rpc workers are a llama\.cpp setting, and this model runs on diffusers"
    ):
        configure("diffusers", llamacpp={"rpc": []})
    # the llamacpp object is read first, as before
    with pytest.raises(BadRequest, match="reasoning-budget"):
        configure("vllm", llamacpp={"reasoning-budget": -2}, vllm={"hf-overrides": {"bad key": 1}})


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"llamacpp": {}},
        {"llamacpp": {"kv-persist": True, "rpc": ""}},
        {"vllm": {"tensor-parallel-size": 1, "ray-address": " "}},
        {"vllm": {"unknown": 1}},
    ],
)
def test_an_object_that_sets_only_defaults_is_no_object(body: dict[str, Any]) -> None:
    """So the same configuration said another way changes nothing (no runner restarted for it)."""
    engine = "vllm" if "vllm" in body else "llama.cpp"
    settings = configure(engine, **body)
    assert settings == ModelSettings() and settings.to_json() == {} and backend_configuration(settings) == {}


@pytest.mark.parametrize(
    ("kind", "value", "why"),
    [
        (LlamaCppSettings, {"reasoning-budget": 2**31}, "reasoning-budget must be -1"),
        (LlamaCppSettings, {"reasoning-budget": None}, "reasoning-budget must be -1"),
        (LlamaCppSettings, {"kv-persist": None}, "kv-persist must be true or false"),
        (LlamaCppSettings, {"rpc": 5}, "rpc must be a list"),
        (LlamaCppSettings, {"draft-from-context": "ngram-cache"}, "must be true, false or one of ngram-mod"),
        (LlamaCppSettings, {"draft-from-context": 1}, "draft-from-context must be true, false or one of"),
        (VllmSettings, {"hf-overrides": [1]}, "hf-overrides must be a JSON object"),
        (VllmSettings, {"hf-overrides": {"a": {"b c": 1}}}, "invalid hf_overrides key 'b c'"),
        (VllmSettings, {"gpu-memory-utilization": 0}, r"gpu-memory-utilization must be a number in \(0, 1\]"),
        (VllmSettings, {"gpu-memory-utilization": True}, "gpu-memory-utilization"),
        (VllmSettings, {"tensor-parallel-size": 1025}, "from 1 to 1024"),
    ],
)
def test_each_type_checks_its_object(kind: type[EngineSettings], value: dict[str, Any], why: str) -> None:
    engine = "vllm" if kind is VllmSettings else "llama.cpp"
    with pytest.raises(BadRequest, match=why):
        kind.from_request(value, engine)


def test_drafting_from_the_context_is_chosen_by_type_or_by_default() -> None:
    assert (
        LlamaCppSettings.from_request({"draft-from-context": True}, "llama.cpp").draft_from_context
        == "ngram-mod"
    )
    chosen = LlamaCppSettings.from_request({"draft-from-context": "ngram-map-k"}, "llama.cpp")
    assert chosen.configuration() == {"draft-from-context": "ngram-map-k"}
    assert LlamaCppSettings.from_json(chosen.to_json()) == chosen  # stored and read back
    assert LlamaCppSettings.from_request({"draft-from-context": False}, "llama.cpp").is_default
    with pytest.raises(
        BadRequest, match=r"draft-from-context is a llama\.cpp setting, and this model runs on vllm"
    ):
        LlamaCppSettings.from_request({"draft-from-context": True}, "vllm")


def test_engines_declare_their_settings_types() -> None:
    """A new engine with settings is its module and its line in the registry: the configure request and the
    stored entries are read by every type the registry's engines declare, in registry order."""
    assert LlamaCppEngine.settings_type is LlamaCppSettings and VllmEngine.settings_type is VllmSettings
    assert configuration_types() == (LlamaCppSettings, VllmSettings)
    others = [e for e in default_registry() if e.name not in ("llama.cpp", "vllm")]
    assert others and all(e.settings_type is EngineSettings for e in others)


def test_the_configure_request_takes_each_engines_object_by_its_key() -> None:
    """The objects a configure request may carry are the registry's settings keys; others stay refused."""
    keys = {kind.key for kind in configuration_types()}
    assert keys == {"llamacpp", "vllm"} and keys <= set(ConfigureRequest.model_fields)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ConfigureRequest.model_validate({"model": "ai/x", "sglang": {"x": 1}})


@pytest.mark.parametrize("engine", default_registry(), ids=lambda e: e.name)
def test_only_an_engine_that_takes_a_draft_model_is_given_one(engine: Engine, tmp_path: Path) -> None:
    request = ConfigureRequest.model_validate({"model": "ai/x", "speculative": {"draft_model": "absent"}})
    store = ModelStore(tmp_path)
    refused = ModelNotFound if engine.takes_draft_model else BadRequest  # the draft is looked up only then
    with pytest.raises(refused):
        settings_from_request(request, None, engine, store)
    assert engine.takes_draft_model is isinstance(engine, LlamaCppEngine)


@pytest.mark.parametrize(
    "module",
    [modelrunner.server.admin_api, modelrunner.server.capabilities, modelrunner.server.ollama_serving],
)
def test_the_routes_name_no_engine_and_no_format(module: ModuleType) -> None:
    """What an engine can do is asked of the engine (DESIGN: no `engine.name == ...` outside engines/)."""
    names = {engine.name for engine in default_registry()} | {"gguf", "safetensors", "dduf"}
    constants = {
        node.value
        for node in ast.walk(ast.parse(Path(str(module.__file__)).read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert not names & constants


def test_the_admin_routes_know_no_engine_internals() -> None:
    source = Path(modelrunner.server.admin_api.__file__).read_text()
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("modelrunner.engines")
    }
    assert imported == {
        "modelrunner.engines.base",
        "modelrunner.engines.registry",
        "modelrunner.engines.settings",
    }
