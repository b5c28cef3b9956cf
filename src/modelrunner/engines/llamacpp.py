"""The llama.cpp engine: `llama-server` serving one GGUF model on a Unix socket.

Install = copy the cached build (engines/build.py compiles it once per machine) into
`<runner home>/engines/llama.cpp/<version>/`; a `llama-server` from `LLAMA_SERVER_PATH` or PATH is adopted
as is.
The command line follows DMR's (contract 5.3) so that users' `LLAMA_ARGS` and runtime flags mean the same.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from modelrunner.artifact.gguf import GGUFInfo, find_gguf_shards, read_gguf
from modelrunner.artifact.model_config import ModelConfig
from modelrunner.engines import (
    build,
    llamacpp_capabilities,
    llamacpp_drafting,
    llamacpp_memory,
    llamacpp_slots,
    rpc_workers,
)
from modelrunner.engines.base import (
    DraftCounts,
    Engine,
    EngineStatus,
    InstallState,
    LaunchSpec,
    Mode,
    ModelForEngine,
    Needs,
    ProgressCallback,
    RunnerSettings,
    SavedSlot,
    SlotError,
)
from modelrunner.engines.gpu import cpu_count, resolve_gpu
from modelrunner.engines.install import INSTALL_INFO, HomeInstall, staged_folder
from modelrunner.engines.llamacpp_binary import (
    EXECUTABLE,
    RPC_EXECUTABLE,
    FoundServer,
    find_server,
    server_version,
)
from modelrunner.engines.llamacpp_capabilities import projector_file, template_file
from modelrunner.engines.llamacpp_flags import RUNTIME_FLAGS, llama_args_from_env
from modelrunner.engines.llamacpp_settings import NAME as NAME  # defined with its settings
from modelrunner.engines.llamacpp_settings import LlamaCppSettings
from modelrunner.errors import BadRequest, EngineInstallError, EngineNotInstalled, ModelRunnerError
from modelrunner.eventlog import event
from modelrunner.fileio import link_or_copy

log = logging.getLogger(__name__)
_VERSION_ALIASES = {None, "", "latest", build.VERSION, str(build.LLAMA_CPP_BUILD)}


def default_threads() -> int:
    """All CPUs up to 4, beyond that half of them: generation is memory-bound and SMT siblings contend."""
    n = cpu_count()
    return n if n <= 4 else max(4, n // 2)


# A generation's prompt is decoded in batches of this many tokens (llama-server's default: 2,048). It looks
# for a cancelled task only between batches: an abandoned prefill went on for 6-12 s on a 2-core CPU, and
# for 0.5-1.2 s at 512; the micro-batch, what is computed at once, is 512 either way (bench/cancel_latency).
CANCEL_BATCH = 512


def base_args() -> list[str]:
    """DMR's base arguments (all layers on the GPU when there is one, Prometheus metrics), or LLAMA_ARGS."""
    raw = os.environ.get("LLAMA_ARGS")
    if raw is not None and raw.strip():
        return llama_args_from_env(raw)
    return ["-ngl", "999", "--metrics", "-t", str(default_threads())]


def model_ggufs(bundle: Path) -> list[Path]:
    """The model's GGUF file, or all shards of a split set in order (the first is what `--model` gets)."""
    folder = bundle / "model"
    single = folder / "model.gguf"
    if single.is_file():
        return [single]
    candidates = sorted(p for p in folder.rglob("*.gguf") if "mmproj" not in p.name.lower())
    if not candidates:
        raise ModelRunnerError("the model's bundle has no GGUF file: remove the model and pull it again")
    return find_gguf_shards(candidates[0])


def _declares_pooling(bundle: Path) -> bool:
    """Whether the GGUF metadata (kept in the bundle's config.json) names a pooling type."""
    try:
        metadata = json.loads((bundle / "config.json").read_text()).get("gguf") or {}
    except (OSError, ValueError, AttributeError):
        return False
    return any(key.endswith(".pooling_type") for key in metadata)


_BATCH_FLAGS = ("-b", "--batch-size", "-ub", "--ubatch-size")
# Flags whose value names this run only (its socket, its save folder, the name asked for): not part of what
# makes a saved KV cache valid.
_RUN_ONLY_FLAGS = frozenset({"--host", "--alias", llamacpp_slots.SLOT_SAVE_FLAG})


_ROPE_FLAGS = frozenset({"--rope-scaling", "--rope-scale", "--rope-freq-scale", "--yarn-orig-ctx"})


def context_extension(context: int, trained: int | None, flags: Sequence[str]) -> list[str]:
    """YaRN rope scaling for a context longer than the model was trained for: without it llama-server serves
    only the training context (it caps the slot, with a warning in its log alone) while `ls`, `inspect` and
    `ps` would show the longer one. The user's own rope flags are left as they are."""
    if context <= 0 or not trained or context <= trained or _ROPE_FLAGS.intersection(flags):
        return []
    # rounded up, so that llama.cpp's training context (trained * scale, in float) is never below context
    scale = math.ceil(context / trained * 100 + 1) / 100
    return ["--rope-scaling", "yarn", "--rope-scale", f"{scale:g}", "--yarn-orig-ctx", str(trained)]


def command_line(
    server: Path,
    model: ModelForEngine,
    mode: Mode,
    settings: RunnerSettings,
    socket: Path,
    trained_context: int | None = None,
) -> list[str]:
    """llama-server's argv, in DMR's order (contract 5.3), plus `--no-webui` (the daemon serves no UI).

    Embedding and reranking runners get a physical batch as large as their context: llama-server embeds
    an input in one batch, so with its default (512) any longer input fails with a 500 (DMR's too).
    `trained_context` is the model's own, what llama-server uses when no context size is set; a longer
    context is served with rope scaling (`context_extension`)."""
    if mode not in LlamaCppEngine.modes:
        raise BadRequest(f"llama.cpp cannot serve {mode.value} requests; use a diffusers model for images")
    if model.format not in LlamaCppEngine.formats:
        raise BadRequest(f"llama.cpp needs a GGUF model, and {model.reference} is {model.format}")
    RUNTIME_FLAGS.check(settings.runtime_flags)
    argv = [str(server), *base_args(), "--model", str(model_ggufs(model.bundle)[0]), "--host", str(socket)]
    # Answers name the model as it was asked for, not by the bundle's file path.
    argv += ["--alias", model.reference]
    if mode is Mode.COMPLETION:
        template = template_file(model.bundle)
        if template is not None:
            argv += ["--chat-template-file", str(template)]
    elif mode is Mode.EMBEDDING:
        argv += ["--embeddings"]
        if "--pooling" not in settings.runtime_flags and not _declares_pooling(model.bundle):
            argv += ["--pooling", "mean"]  # a generative GGUF has none, and /v1/embeddings needs one
    else:
        argv += ["--embeddings", "--reranking"]
    own = settings.of(LlamaCppSettings)
    if own.reasoning_budget is not None:
        argv += ["--reasoning-budget", str(own.reasoning_budget)]
    context = settings.context_size if settings.context_size is not None else model.context_size
    if context is not None:
        argv += ["--ctx-size", str(context)]
        argv += context_extension(context, trained_context, settings.runtime_flags)
    if own.rpc_workers:  # layers spread over llama.cpp RPC workers (engines/rpc_workers.py)
        argv += ["--rpc", ",".join(own.rpc_workers)]
    batch = context if context is not None and context > 0 else trained_context
    own_batch = any(f in settings.runtime_flags for f in _BATCH_FLAGS)
    if mode is not Mode.COMPLETION and batch and not own_batch:
        argv += ["--batch-size", str(batch), "--ubatch-size", str(batch)]
    elif mode is Mode.COMPLETION and not own_batch:
        argv += ["--batch-size", str(CANCEL_BATCH)]
    argv += list(settings.runtime_flags)
    mmproj = projector_file(model.bundle)
    argv += ["--mmproj", str(mmproj)] if mmproj is not None else ["--jinja"]
    if settings.draft_bundle is not None:  # speculative decoding with a draft model (DMR's flags)
        argv += ["--model-draft", str(model_ggufs(settings.draft_bundle)[0])]
    spec_types = drafting_types(mode, settings)
    if spec_types and llamacpp_drafting.SPEC_TYPE_FLAG not in settings.runtime_flags:
        argv += [llamacpp_drafting.SPEC_TYPE_FLAG, ",".join(spec_types)]
    if settings.draft_bundle is not None:
        if settings.draft_tokens is not None:
            argv += ["--spec-draft-n-max", str(settings.draft_tokens)]
        if settings.draft_min_probability is not None:
            argv += ["--spec-draft-p-min", f"{settings.draft_min_probability:.2f}"]
    return [*argv, "--no-webui"]


def drafting_types(mode: Mode, settings: RunnerSettings) -> list[str]:
    """The speculative decoding types of a runner (engines/llamacpp_drafting.py): drafts from the context
    (completion runners that were configured so), then the draft model's."""
    context_type = settings.of(LlamaCppSettings).draft_from_context if mode is Mode.COMPLETION else None
    return llamacpp_drafting.spec_types(context_type, settings.draft_bundle is not None)


class LlamaCppEngine(Engine):
    name = NAME
    formats = frozenset({"gguf"})
    modes = frozenset({Mode.COMPLETION, Mode.EMBEDDING, Mode.RERANKING})
    settings_type = LlamaCppSettings
    flag_rules = RUNTIME_FLAGS
    assembles_unstreamed = True  # llama-server stops generating for a client that left only in a stream
    schema_grammar = True
    completions_json_schema = True  # its completions route ignores response_format
    ignores_forced_tool_choice = True  # b11434 builds the grammar of a forced choice and does not apply it
    takes_draft_model = True  # --model-draft
    chooses_slots = True  # the idle slot with the most similar prompt, else the least recently used

    def __init__(self, install_root: Path | None = None) -> None:
        self.home = HomeInstall(NAME, install_root)
        self._gguf_info: dict[tuple[str, ...], GGUFInfo] = {}

    @property
    def install_root(self) -> Path:
        return self.home.root

    # -- install state -------------------------------------------------------------------------------

    def find(self) -> FoundServer | None:
        return find_server(self.install_root)

    def server_path(self) -> Path:
        """The executable to run; EngineNotInstalled (412, with the install hint) when there is none."""
        found = self.find()
        if found is None:
            raise EngineNotInstalled(f"llama.cpp is not installed; {self.install_hint}")
        try:
            server_version(found.path)  # cached; a broken binary fails here, not as a runner that dies
        except EngineInstallError as exc:
            if found.source == "LLAMA_SERVER_PATH":
                fix = f"fix or unset LLAMA_SERVER_PATH, or {self.install_hint}"
            else:
                fix = "run: model reinstall-runner --backend llama.cpp"
            raise EngineNotInstalled(
                f"the llama-server from {found.source} does not work ({exc.message}); {fix}"
            ) from None
        return found.path

    def status(self) -> EngineStatus:
        installing = self.home.tracker.status_now()
        if installing:
            return installing
        found = self.find()
        if found is None:
            return self.home.tracker.failed_or(
                EngineStatus(InstallState.NOT_INSTALLED, detail="no llama-server found")
            )
        try:
            version = server_version(found.path)
        except EngineInstallError as exc:
            return EngineStatus(InstallState.ERROR, detail=f"{EXECUTABLE} from {found.source}: {exc.message}")
        installed = self._install_info(found) if found.source == "installed" else {}
        return EngineStatus(
            InstallState.RUNNING, version=version, detail=build.describe_turned_off(installed) or ""
        )

    @staticmethod
    def _install_info(found: FoundServer) -> dict[str, object]:
        """What install.json of an installed build says ({} when it cannot be read)."""
        try:
            info = json.loads((found.path.parent.parent / INSTALL_INFO).read_text())
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    def prepare_install(self, gpu: str = "auto", version: str | None = None) -> None:
        if version not in _VERSION_ALIASES:
            raise BadRequest(
                f"llama.cpp version {version!r} is not available: this model runner builds {build.VERSION}"
            )
        resolve_gpu(gpu)

    def install(self, progress: ProgressCallback, gpu: str = "auto", force: bool = False) -> EngineStatus:
        spec = build.BuildSpec(resolve_gpu(gpu))
        with self.home.installing(f"installing llama.cpp {build.VERSION}"):
            self._install(spec, progress, force)
        return self.status()

    def _install(self, spec: build.BuildSpec, progress: ProgressCallback, force: bool) -> None:
        if not force:
            usable = self._usable_install(spec)
            if usable is not None:
                progress(usable)
                return
        found = self.find()
        if not force and found is not None and found.source == "installed":
            progress(f"The installed llama.cpp is not this machine's proven build ({spec.key}): replacing it")
        cached = build.cached_server(spec)
        if cached is not None:
            progress(f"Using the cached build of llama.cpp {build.VERSION} ({spec.key})")
        else:
            progress(
                f"No proven build of llama.cpp {build.VERSION} for this machine in the cache: making one"
            )
            cached = build.ensure_built(spec, progress)
        self._place(cached, spec)
        info = build.build_info(spec)
        off = build.describe_turned_off(info)
        progress(
            f"Installed llama.cpp {build.VERSION}"
            + ("" if spec.gpu == "none" else f" ({spec.gpu})")
            + (f", {off}" if off else "")
        )

    def _usable_install(self, spec: build.BuildSpec) -> str | None:
        """Why nothing needs doing (a working adopted or installed server), or None."""
        found = self.find()
        if found is None:
            return None
        try:
            version = server_version(found.path)
        except EngineInstallError:
            return None  # broken: install over it
        if found.source != "installed":
            return f"Using llama.cpp {version} from {found.source}"
        installed = self._install_info(found)
        has_worker = (found.path.parent / RPC_EXECUTABLE).is_file()  # installs before RPC lack it
        if version != build.VERSION or installed.get("gpu") != spec.gpu or not has_worker:
            return None
        # Only the cache's proven build is kept: an install made before builds were proven (which may die
        # on this CPU's instructions) or from an older build of the same version is replaced.
        proven = build.cached_server(spec) is not None
        if proven and installed.get("build_id") == build.build_info(spec).get("build_id"):
            return f"llama.cpp {version} is already installed (the proven build {spec.key})"
        return None

    def _place(self, cached: Path, spec: build.BuildSpec) -> None:
        """Copy (or hard-link) the cached build into `<install root>/<version>/`, replacing any older one."""
        with self.home.locked() as root, staged_folder(root / build.VERSION) as staging:
            (staging / "bin").mkdir()
            link_or_copy(cached, staging / "bin" / EXECUTABLE)
            link_or_copy(cached.parent / RPC_EXECUTABLE, staging / "bin" / RPC_EXECUTABLE)
            licence = cached.parent.parent / "LICENSE"
            if licence.is_file():
                shutil.copyfile(licence, staging / "LICENSE")
            proven = build.build_info(spec)
            info = {
                "version": build.VERSION,
                "gpu": spec.gpu,
                "build": spec.key,
                "build_id": proven.get("build_id"),  # which proven build this is a copy of
                "turned_off": proven.get("turned_off", []),
            }
            (staging / INSTALL_INFO).write_text(json.dumps(info) + "\n")

    def uninstall(self) -> None:
        self.home.remove()

    def disk_usage(self) -> int:
        return self.home.disk_usage()

    # -- what a model can do -------------------------------------------------------------------------

    def check_request(self, name: str, config: ModelConfig, bundle: Path, needs: Needs) -> None:
        llamacpp_capabilities.check_request(name, config, bundle, needs)

    def capabilities(self, config: ModelConfig, bundle: Path) -> list[str]:
        return llamacpp_capabilities.capabilities(config, bundle)

    # -- runners -------------------------------------------------------------------------------------

    def launch_spec(
        self, model: ModelForEngine, mode: Mode, settings: RunnerSettings, socket: Path
    ) -> LaunchSpec:
        trained = self.gguf_info(model).context_size
        argv = command_line(self.server_path(), model, mode, settings, socket, trained)
        if "--yarn-orig-ctx" in argv and "--yarn-orig-ctx" not in settings.runtime_flags:
            served = argv[argv.index("--ctx-size") + 1]
            event(log, "context_extended", model=model.reference, trained=trained, context=served, how="yarn")
        workers = list(settings.of(LlamaCppSettings).rpc_workers)
        drafting = llamacpp_drafting.drafting(argv)
        if not workers:
            return LaunchSpec(argv=argv, socket=socket, drafting=drafting)
        return LaunchSpec(
            argv=argv,
            socket=socket,
            drafting=drafting,
            # a lost worker aborts llama-server: say why at once, without a debugger's backtrace first
            env={"GGML_NO_BACKTRACE": "1"},
            preflight=functools.partial(rpc_workers.check_workers, workers),
            layout={"rpc_workers": workers},
        )

    def kv_identity(self, model: ModelForEngine, spec: LaunchSpec) -> str:
        if self.gguf_info(model).sliding_window:  # restored without a checkpoint, it re-prefills (#24956)
            raise SlotError("the model uses sliding-window attention, which llama.cpp cannot restore whole")
        argv, kept = spec.argv[1:], []
        for i, arg in enumerate(argv):
            if arg in _RUN_ONLY_FLAGS or (i and argv[i - 1] in _RUN_ONLY_FLAGS):
                continue
            kept.append(arg)
        return json.dumps([server_version(Path(spec.argv[0])), kept])

    def with_slot_folder(self, spec: LaunchSpec, folder: Path) -> LaunchSpec:
        return dataclasses.replace(spec, argv=[*spec.argv, llamacpp_slots.SLOT_SAVE_FLAG, str(folder)])

    async def working_slots(self, socket: Path, timeout: float) -> int | None:
        return await llamacpp_slots.working_slots(socket, timeout)

    async def draft_counts(self, socket: Path, timeout: float) -> DraftCounts | None:
        return await llamacpp_drafting.draft_counts(socket, timeout)

    async def save_slots(self, socket: Path, folder: Path, timeout: float) -> list[SavedSlot]:
        return await llamacpp_slots.save_slots(socket, folder, timeout)

    async def restore_slot(self, socket: Path, slot: SavedSlot, timeout: float) -> int:
        return await llamacpp_slots.restore_slot(socket, slot, timeout)

    async def probe_slot(self, socket: Path, slot: SavedSlot, timeout: float) -> int:
        return await llamacpp_slots.probe_slot(socket, slot, timeout)

    def gguf_info(self, model: ModelForEngine) -> GGUFInfo:
        return self._bundle_info(model.bundle)

    def _bundle_info(self, bundle: Path) -> GGUFInfo:
        files = model_ggufs(bundle)
        key = tuple(str(p) for p in files)
        if key not in self._gguf_info:
            self._gguf_info[key] = read_gguf(files)
        return self._gguf_info[key]

    def estimate_memory(self, model: ModelForEngine, settings: RunnerSettings) -> int:
        info = self.gguf_info(model)
        context = settings.context_size if settings.context_size is not None else model.context_size
        if context is None or context <= 0:  # llama-server's default (and -1): the model's trained context
            context = info.context_size or 4096
        flags = [*base_args(), *settings.runtime_flags]
        kv = llamacpp_memory.kv_settings(flags, context)
        if settings.of(
            LlamaCppSettings
        ).rpc_workers:  # only what stays here counts against this machine's budget
            total = llamacpp_memory.local_share(info, kv, llamacpp_memory.gpu_layers(flags)).total
        else:
            total = llamacpp_memory.estimate(info, kv).total
        if settings.draft_bundle is not None:  # the draft model runs in the same process, same context
            total += llamacpp_memory.estimate(self._bundle_info(settings.draft_bundle), kv).total
        return total
