"""The engine contract: what the scheduler needs from an inference engine, and nothing about HTTP routing.

An engine knows how to install itself, report its state, and turn (model bundle, mode, configuration)
into the command line of one process that serves one model on a Unix socket. One engine = one module
plus one line in `engines/registry.py`.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from modelrunner.artifact.model_config import ModelConfig
from modelrunner.engines.runtime_flags import FlagRules, no_flags
from modelrunner.engines.settings import EngineSettings, S, settings_of


class Mode(enum.StrEnum):
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    RERANKING = "reranking"
    IMAGE_GENERATION = "image-generation"


class InstallState(enum.StrEnum):
    RUNNING = "Running"  # installed and usable (DMR's word)
    NOT_INSTALLED = "Not Installed"
    INSTALLING = "Installing"
    ERROR = "Error"


@dataclass(frozen=True)
class EngineStatus:
    state: InstallState
    version: str | None = None
    detail: str = ""  # why not installed / the error; shown by `model status`

    def describe(self, engine: str) -> str:
        """DMR's /engines/status value, e.g. "Running: llama.cpp b11434", "Not Installed: only on Linux"."""
        if self.state is InstallState.RUNNING:  # detail: what a running build lacks, e.g. "built without amx"
            running = f"Running: {engine} {self.version or ''}".rstrip()
            return f"{running} ({self.detail})" if self.detail else running
        return f"{self.state.value}: {self.detail}" if self.detail else self.state.value


@dataclass(frozen=True)
class RunnerSettings:
    """Per (model, mode) settings from `model configure`, already validated."""

    context_size: int | None = None
    runtime_flags: tuple[str, ...] = ()
    # speculative decoding: the draft model's bundle (found by the scheduler), tokens drafted per step,
    # minimum draft probability
    draft_bundle: Path | None = None
    draft_tokens: int | None = None
    draft_min_probability: float | None = None
    # the engines' own settings (each engine reads its `settings_type` with `of`)
    engines: tuple[EngineSettings, ...] = ()

    def of(self, kind: type[S]) -> S:
        return settings_of(self.engines, kind)


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one runner process: it must listen on `socket` and answer `health_path` 200 when ready."""

    argv: list[str]
    socket: Path
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    # Run in a thread before the process starts: checks what the engine needs beyond this machine (RPC
    # workers, a Ray cluster) and raises a ModelRunnerError naming what is missing, instead of an engine
    # that dies or waits for ever.
    preflight: Callable[[], object] | None = None
    # How the model is spread beyond this process (parallel sizes, workers, cluster): shown by `model ps`.
    layout: dict[str, object] = field(default_factory=dict)
    # How it drafts tokens for speculative decoding ("" when it does not): shown by `model ps`.
    drafting: str = ""


@dataclass(frozen=True)
class DraftCounts:
    """Speculative decoding's tokens so far in one runner: drafted, and accepted by the model."""

    drafted: int
    accepted: int

    def to_api(self) -> dict[str, object]:
        rate = round(self.accepted / self.drafted, 4) if self.drafted else None
        return {"drafted_tokens": self.drafted, "accepted_tokens": self.accepted, "acceptance_rate": rate}


@dataclass(frozen=True)
class ModelForEngine:
    """What an engine is told about the model it serves."""

    id: str  # sha256:...
    reference: str  # as requested, e.g. "ai/smollm2"
    bundle: Path  # the store bundle folder (config.json, model/...)
    format: str  # gguf | safetensors | dduf
    context_size: int | None  # from the model's config
    size_bytes: int  # total bytes of the model's weights


ProgressCallback = Callable[[str], None]


@dataclass(frozen=True)
class Needs:
    """What a request needs of its model beyond text (server/capabilities.py reads it from the body)."""

    images: bool = False
    tools: bool = False

    def __bool__(self) -> bool:
        """Whether there is anything to check (most requests: no, and their model's files are not read)."""
        return self.images or self.tools


NOTHING = Needs()


@dataclass(frozen=True)
class SavedSlot:
    """One engine slot's prompt cache, saved to a file in the runner's save folder (warm resume)."""

    slot: int
    filename: str
    tokens: int
    bytes: int
    prompt: tuple[int, ...]  # the tokens saved: a restore is checked by reusing them (Engine.probe_slot)


class SlotError(Exception):
    """The engine refused or failed a slot save or restore."""


class Engine(ABC):
    name: str
    formats: frozenset[str]
    modes: frozenset[Mode]
    # Its own settings (the object of the configure request named by `settings_type.key`), read and
    # written by that type: nothing above the engines knows its keys.
    settings_type: ClassVar[type[EngineSettings]] = EngineSettings
    # The flags of its command line that `model configure` may set; None: it takes none.
    flag_rules: ClassVar[FlagRules | None] = None

    # A non-streamed generation is asked for as a stream and assembled by the daemon (compat/assemble.py):
    # an engine that stops generating for a client that left only while it streams (llama-server) needs
    # it; one that aborts a generation whose client closed, streamed or not (vLLM), does not.
    assembles_unstreamed: bool = False
    # How its OpenAI-compatible API takes what a request asks (server/engine_request.py, compat/):
    schema_grammar: bool = False  # a JSON schema (response_format) becomes a grammar it applies
    completions_json_schema: bool = False  # its /v1/completions reads a schema from `json_schema` only
    # A forced tool_choice ("required", a named tool) is accepted but not applied: the daemon forces the call
    # with a grammar of its own (compat/tool_choice.py)
    ignores_forced_tool_choice: bool = False
    # Speculative decoding with a draft model of its own formats (`model configure --speculative-...`)
    takes_draft_model: bool = False
    # It puts each request on one of its slots itself, finishing a batch before it sees a cancel, and says
    # how many work (`working_slots`): a retry of an abandoned request waits for that slot to free
    chooses_slots: bool = False

    @abstractmethod
    def status(self) -> EngineStatus: ...

    @abstractmethod
    def install(self, progress: ProgressCallback, gpu: str = "auto", force: bool = False) -> EngineStatus: ...

    @abstractmethod
    def uninstall(self) -> None: ...

    def validate_runtime_flags(self, flags: list[str]) -> None:
        """Raise BadRequest for a flag outside the allow-list or a value that is a path."""
        if self.flag_rules is None:
            no_flags(self.name, flags)
        else:
            self.flag_rules.check(flags)

    @abstractmethod
    def launch_spec(
        self, model: ModelForEngine, mode: Mode, settings: RunnerSettings, socket: Path
    ) -> LaunchSpec: ...

    @abstractmethod
    def estimate_memory(self, model: ModelForEngine, settings: RunnerSettings) -> int:
        """Bytes of RAM (or accelerator memory) one runner of this model will need."""

    def disk_usage(self) -> int:
        return 0

    # -- what a model served by this engine can do -------------------------------------------------

    def check_request(self, name: str, config: ModelConfig, bundle: Path, needs: Needs) -> None:
        """BadRequest, in Ollama's words ("<name> does not support vision|tools"), when a request that
        `needs` images or tools asks what this engine cannot do with the model (`bundle`: its store folder).
        Every API checks here before the engine is asked; by default everything is accepted."""
        return None

    def capabilities(self, config: ModelConfig, bundle: Path) -> list[str]:
        """What the model allows beyond completion, as Ollama's `/api/show` lists it (`tools`, `vision`,
        `thinking`), decided as `check_request` decides. By default: tools (the engine takes them with
        every model)."""
        return ["tools"]

    def cluster_status(self, settings: Sequence[RunnerSettings]) -> list[dict[str, object]]:
        """What this engine's runners use beyond this machine as configured in `settings` (e.g. a Ray
        cluster: its nodes and resources), probed now, for `model status`; [] when nothing is."""
        return []

    # -- warm resume: saving and restoring prompt caches (scheduler/warm.py) ---------------------------

    def kv_identity(self, model: ModelForEngine, spec: LaunchSpec) -> str:
        """Everything of this run besides the model that makes a saved KV cache valid for it (the engine
        build, context size, slots, cache types, ...): runs that differ in it never share a cache. Raises
        SlotError saying why when this engine or model cannot have its slots saved."""
        raise SlotError(f"{self.name} cannot save its prompt cache")

    def with_slot_folder(self, spec: LaunchSpec, folder: Path) -> LaunchSpec:
        """`spec`, made to save and restore slots in `folder`."""
        raise SlotError(f"{self.name} cannot save its prompt cache")

    async def save_slots(self, socket: Path, folder: Path, timeout: float) -> list[SavedSlot]:
        """Save every slot that holds a prompt into the slot folder; SlotError when the engine fails."""
        raise SlotError(f"{self.name} cannot save its prompt cache")

    async def restore_slot(self, socket: Path, slot: SavedSlot, timeout: float) -> int:
        """Restore a saved slot from the slot folder: the tokens restored; SlotError when it fails."""
        raise SlotError(f"{self.name} cannot restore a prompt cache")

    async def probe_slot(self, socket: Path, slot: SavedSlot, timeout: float) -> int:
        """Send a restored slot its saved prompt: how many of its tokens the engine took from the cache."""
        raise SlotError(f"{self.name} cannot restore a prompt cache")

    async def working_slots(self, socket: Path, timeout: float) -> int | None:
        """How many requests the engine works on now (`chooses_slots` engines; a retry of an abandoned
        request waits for it: scheduler/conversations.py); None when it does not say."""
        return None

    async def draft_counts(self, socket: Path, timeout: float) -> DraftCounts | None:
        """A drafting runner's (LaunchSpec.drafting) tokens drafted and accepted so far; None when the
        engine does not say."""
        return None

    # -- helpers with defaults (added for install routes and the scheduler) --------------------------

    @property
    def install_hint(self) -> str:
        """What a user runs to install this engine; part of every "not installed" message."""
        return f"run: model install-runner --backend {self.name}"

    def prepare_install(self, gpu: str = "auto", version: str | None = None) -> None:
        """Raise (EngineUnsupported, BadRequest) before any work when an install cannot succeed (unknown
        version, missing GPU toolchain), so a route can answer with a proper status before streaming."""
        return None

    def require_installed(self) -> EngineStatus:
        """The engine's status when usable; else EngineNotInstalled (412) with the install hint."""
        from modelrunner.errors import EngineNotInstalled

        status = self.status()
        if status.state is InstallState.RUNNING:
            return status
        why = f" ({status.detail})" if status.detail else ""
        raise EngineNotInstalled(f"{self.name} is not installed{why}; {self.install_hint}")
