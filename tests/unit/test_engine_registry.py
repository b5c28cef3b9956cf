"""The engine registry is the one place that picks an engine: by backend name (`find`) and by a model's
format (`resolve`, from `Engine.formats`), with one error naming the choices."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from modelrunner.artifact.model_config import ModelConfig
from modelrunner.engines.registry import EngineRegistry, default_registry
from modelrunner.errors import UnknownEngine
from tests.fake_engine import FakeEngine


@pytest.fixture
def registry() -> EngineRegistry:
    return EngineRegistry.of(default_registry())


@pytest.mark.parametrize("backend", [None, "llama.cpp", "vllm", "mlx", "sglang", "diffusers"])
@pytest.mark.parametrize(
    ("model_format", "engine"),
    [("gguf", "llama.cpp"), ("safetensors", "vllm"), ("dduf", "diffusers"), ("diffusers", "diffusers")],
)
def test_the_format_decides_whatever_backend_is_named(
    registry: EngineRegistry, backend: str | None, model_format: str, engine: str
) -> None:
    if model_format == "gguf" and backend == "sglang":
        engine = backend  # kept as DMR keeps it: it cannot run here, and its 412 says so
    assert registry.resolve(backend, model_format).name == engine


def test_a_format_no_engine_claims_goes_to_the_default_engine(registry: EngineRegistry) -> None:
    assert registry.default is registry["llama.cpp"]
    assert registry.resolve(None, "").name == "llama.cpp"  # a config that names no format
    assert registry.resolve("vllm", "").name == "llama.cpp"  # vLLM runs here and serves safetensors only
    assert registry.resolve("mlx", "").name == "llama.cpp"  # MLX runs here too, and serves MLX's files only
    assert registry.resolve("sglang", "").name == "sglang"  # DMR keeps the backend asked for


def safetensors_config(written_by: str) -> ModelConfig:
    """A safetensors model's config as packaging makes it: the first file's `__metadata__` under
    `safetensors` (DMR's format/safetensors.go extractMetadata)."""
    metadata = {"format": written_by, "tensor_count": "3"}
    return ModelConfig({"format": "safetensors", "safetensors": metadata}, created=0)


@pytest.mark.parametrize("backend", [None, "llama.cpp", "vllm", "mlx", "diffusers"])
def test_safetensors_that_mlx_wrote_go_to_mlx_the_others_to_vllm(
    registry: EngineRegistry, backend: str | None
) -> None:
    assert registry.resolve(backend, safetensors_config("mlx")).name == "mlx"
    assert registry.resolve(backend, safetensors_config("pt")).name == "vllm"
    assert registry.resolve(backend, ModelConfig({"format": "safetensors"}, created=0)).name == "vllm"
    # a GGUF whose metadata happened to say mlx is still llama.cpp's: only safetensors are MLX's
    gguf = ModelConfig({"format": "gguf", "safetensors": {"format": "mlx"}}, created=0)
    assert registry.resolve(backend, gguf).name == "llama.cpp"


def test_an_unknown_backend_is_one_404_naming_the_choices(registry: EngineRegistry) -> None:
    choices = "use one of llama.cpp, vllm, mlx, sglang, diffusers"
    picks: list[Callable[[], object]] = [
        lambda: registry.find("llama"),
        lambda: registry.resolve("llama", "gguf"),
    ]
    for pick in picks:
        with pytest.raises(UnknownEngine) as info:
            pick()
        assert info.value.status_code == 404
        assert info.value.message == f"unknown backend 'llama': {choices}"
    with pytest.raises(UnknownEngine) as long:
        registry.resolve("x" * 500, "gguf")
    assert long.value.message == f"unknown backend {'x' * 40!r}: {choices}"


class OnnxEngine(FakeEngine):
    """A new engine: its module declares a name and the formats it serves, nothing else is needed."""

    formats = frozenset({"onnx", "gguf"})


def test_a_new_engine_is_one_module_plus_one_line() -> None:
    registry = EngineRegistry.of([*default_registry(), OnnxEngine("onnx")])  # the one line
    assert registry.find("onnx").name == "onnx"
    assert registry.resolve(None, "onnx").name == "onnx"
    assert registry.resolve("onnx", "gguf").name == "onnx"  # asked for, and it serves GGUF
    assert registry.resolve(None, "gguf").name == "llama.cpp"  # the default engine
    with pytest.raises(UnknownEngine, match=r"use one of llama\.cpp, vllm, mlx, sglang, diffusers, onnx$"):
        registry.find("nope")


def test_an_empty_registry_resolves_nothing() -> None:
    empty = EngineRegistry({})
    assert empty.default is None
    with pytest.raises(UnknownEngine, match="no engine"):
        empty.resolve(None, "gguf")
