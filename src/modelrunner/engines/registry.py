"""Every engine by name: the ones modelrunner runs, and status-only entries for the rest of DMR's backends;
and the one place that picks the engine of a backend name or a model's format (`EngineRegistry`).

A status-only engine answers `status()` honestly (not installed, and why) and refuses installs and loads
with a clear message, so `/engines/status` and `model status` list every backend DMR names.

A new engine is one module (an `Engine` with its `name`, `formats` and `modes`) plus one line in
`default_registry`: its place in that list is its rank when two engines serve the same format.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from modelrunner.artifact.mediatypes import FORMAT_SAFETENSORS
from modelrunner.artifact.model_config import ModelConfig
from modelrunner.engines import mlx
from modelrunner.engines.base import (
    Engine,
    EngineStatus,
    InstallState,
    LaunchSpec,
    Mode,
    ModelForEngine,
    ProgressCallback,
    RunnerSettings,
)
from modelrunner.engines.diffusers import DiffusersEngine
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.engines.mlx import MlxEngine
from modelrunner.engines.settings import EngineSettings
from modelrunner.engines.vllm import VllmEngine
from modelrunner.errors import EngineNotInstalled, EngineUnsupported, UnknownEngine


class UnavailableEngine(Engine):
    """An engine modelrunner knows by name but cannot install or run here."""

    def __init__(
        self, name: str, formats: frozenset[str], modes: frozenset[Mode], reason: str, supported: bool
    ) -> None:
        self.name = name
        self.formats = formats
        self.modes = modes
        self.reason = reason
        self.supported = supported  # False: wrong platform; True: runs here, but not in modelrunner yet

    @property
    def install_hint(self) -> str:
        return f"installing {self.name} is not available: {self.reason}"

    def status(self) -> EngineStatus:
        return EngineStatus(InstallState.NOT_INSTALLED, detail=self.reason)

    def prepare_install(self, gpu: str = "auto", version: str | None = None) -> None:
        raise EngineUnsupported(f"{self.name} cannot be installed: {self.reason}")

    def install(self, progress: ProgressCallback, gpu: str = "auto", force: bool = False) -> EngineStatus:
        self.prepare_install(gpu)
        raise AssertionError("unreachable")

    def uninstall(self) -> None:
        return None  # nothing was ever installed

    def validate_runtime_flags(self, flags: list[str]) -> None:
        raise EngineNotInstalled(f"{self.name} is not installed ({self.reason})")

    def launch_spec(
        self, model: ModelForEngine, mode: Mode, settings: RunnerSettings, socket: Path
    ) -> LaunchSpec:
        raise EngineNotInstalled(f"{self.name} is not installed ({self.reason})")

    def estimate_memory(self, model: ModelForEngine, settings: RunnerSettings) -> int:
        raise EngineNotInstalled(f"{self.name} is not installed ({self.reason})")


def _placeholders() -> list[Engine]:
    completion = frozenset({Mode.COMPLETION, Mode.EMBEDDING})
    on_linux = sys.platform.startswith("linux")
    return [
        UnavailableEngine(
            "sglang",
            frozenset({"safetensors"}),
            completion,
            "not yet available in modelrunner" if on_linux else "only supported on Linux",
            supported=on_linux,
        ),
    ]


def default_registry() -> list[Engine]:
    """Every engine DMR names, in its order (contract 2.2): llama.cpp, vllm, mlx, the status-only entries,
    diffusers. The first is the default backend; for a format, the first engine that serves it wins."""
    return [LlamaCppEngine(), VllmEngine(), MlxEngine(), *_placeholders(), DiffusersEngine()]


def engine_format(model: ModelConfig) -> str:
    """The format that picks a model's engine: its config's, except `mlx` for safetensors that MLX wrote
    (engines/mlx.py is_mlx_model): those go to MLX, every other safetensors model to vLLM."""
    if model.format == FORMAT_SAFETENSORS and mlx.is_mlx_model(model.config):
        return mlx.FORMAT
    return model.format


@functools.cache
def configuration_types() -> tuple[type[EngineSettings], ...]:
    """The settings types of the engines that have an object in a model's configuration (`llamacpp`,
    `vllm`), in registry order: what reads those objects of a configure request and of a stored entry,
    whichever engine runs the model (DMR keeps every engine's object in each configuration)."""
    kinds = (engine.settings_type for engine in default_registry())
    return tuple(dict.fromkeys(kind for kind in kinds if kind.key is not None))


class EngineRegistry(Mapping[str, Engine]):
    """A daemon's engines by backend name, in rank order; the only place that chooses one."""

    def __init__(self, engines: Mapping[str, Engine]) -> None:
        self._engines = dict(engines)

    @classmethod
    def of(cls, engines: Iterable[Engine]) -> EngineRegistry:
        return cls({engine.name: engine for engine in engines})

    def __getitem__(self, name: str) -> Engine:
        return self._engines[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._engines)

    def __len__(self) -> int:
        return len(self._engines)

    @property
    def default(self) -> Engine | None:
        """DMR's default backend: the first engine (llama.cpp in the default registry)."""
        return next(iter(self._engines.values()), None)

    def find(self, name: str) -> Engine:
        """The engine of a backend name; UnknownEngine (404) naming the choices otherwise."""
        engine = self._engines.get(name)
        if engine is None:
            raise UnknownEngine(f"unknown backend {name[:40]!r}: use one of {', '.join(self._engines)}")
        return engine

    def resolve(self, backend: str | None, model: ModelConfig | str) -> Engine:
        """The engine that runs a model (its config, or a format) when `backend` (or none) is asked for
        (DMR's selectBackendForModel; a config's format is `engine_format`'s). A named backend must exist.
        A format whose first engine (in registry order) is not the default goes to it, whatever the URL says
        (safetensors to vLLM, MLX's to mlx, DDUF to diffusers); any other format (GGUF, or a config that
        names none) stays with the backend asked for, as in DMR, if that engine serves it or is one this
        runner does not implement (SGLang: its 412 says why); a real engine asked for a format it does not
        serve (vLLM for a GGUF model) gives way to the default."""
        model_format = model if isinstance(model, str) else engine_format(model)
        named = self.find(backend) if backend is not None else None
        default = self.default
        if default is None:
            raise UnknownEngine("no engine is registered in this daemon")
        owner = next((engine for engine in self._engines.values() if model_format in engine.formats), None)
        if owner is not None and owner is not default:
            return owner
        if named is not None and (model_format in named.formats or isinstance(named, UnavailableEngine)):
            return named
        return default


def platform_name() -> str:
    return {"linux": "linux", "darwin": "macos", "win32": "windows"}.get(sys.platform, sys.platform)


def is_supported_here(engine: Engine) -> bool:
    return not isinstance(engine, UnavailableEngine) or engine.supported
