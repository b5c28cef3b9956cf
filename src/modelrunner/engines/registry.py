"""Every engine by name: the ones modelrunner runs, and status-only entries for the rest of DMR's backends.

A status-only engine answers `status()` honestly (not installed, and why) and refuses installs and loads
with a clear message, so `/engines/status` and `model status` list every backend DMR names.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping
from pathlib import Path

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
from modelrunner.engines.vllm import VllmEngine
from modelrunner.errors import EngineNotInstalled, EngineUnsupported, UnknownEngine

DEFAULT_ENGINE = "llama.cpp"
# DMR's backend names, in its order (contract 2.2).
ENGINE_NAMES = ("llama.cpp", "vllm", "mlx", "sglang", "diffusers")


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


def _is_macos_arm64() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def _placeholders() -> list[Engine]:
    completion = frozenset({Mode.COMPLETION, Mode.EMBEDDING})
    on_linux = sys.platform.startswith("linux")
    not_yet = "not yet available in modelrunner"
    return [
        UnavailableEngine(
            "mlx",
            frozenset({"safetensors"}),
            completion,
            not_yet if _is_macos_arm64() else "only supported on macOS arm64",
            supported=_is_macos_arm64(),
        ),
        UnavailableEngine(
            "sglang",
            frozenset({"safetensors"}),
            completion,
            not_yet if on_linux else "only supported on Linux",
            supported=on_linux,
        ),
    ]


def default_registry() -> list[Engine]:
    """Every engine DMR names, in its order: llama.cpp, vllm, the status-only entries, diffusers."""
    return [LlamaCppEngine(), VllmEngine(), *_placeholders(), DiffusersEngine()]


def find_engine(engines: Mapping[str, Engine], name: str) -> Engine:
    """The engine of a backend name; UnknownEngine (404) naming the choices otherwise."""
    engine = engines.get(name)
    if engine is None:
        raise UnknownEngine(f"unknown backend {name!r}: use one of {', '.join(engines)}")
    return engine


def platform_name() -> str:
    return {"linux": "linux", "darwin": "macos", "win32": "windows"}.get(sys.platform, sys.platform)


def is_supported_here(engine: Engine) -> bool:
    return not isinstance(engine, UnavailableEngine) or engine.supported
