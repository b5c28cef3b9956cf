"""The MLX engine: `mlx_lm.server` serving one MLX-format safetensors model on a Unix socket, from its own
virtual environment (DMR's `mlx` backend, pkg/inference/backends/mlx).

Which models: safetensors that MLX wrote. MLX saves every weights file with `{"format": "mlx"}` in its
header's `__metadata__` (mlx_lm/utils.py save_model), and the model's config keeps that map under
`safetensors` (DMR's format/safetensors.go extractMetadata). DMR itself picks no engine by it (scheduler.go
selectBackendForModel sends every safetensors model to vLLM where vLLM runs, to MLX only on macOS arm64);
here MLX's own files go to MLX, whose quantized layout vLLM cannot load, and every other safetensors model
stays with vLLM (`is_mlx_model`, used by engines/registry.py).

The environment (mlx-lm and MLX, on Linux MLX's CPU build; ~370 MB, no torch) takes about a minute of pip,
so it is made once per machine in `${XDG_CACHE_HOME:-~/.cache}/modelrunner/mlx/<key>/` (key: the pins,
Python, architecture) and a runner home's install (`<home>/engines/mlx/<version>/`) is a link to it plus
install.json, as for diffusers. `python -m modelrunner.engines.mlx` fills the cache (scripts/test-setup).

mlx_lm.server listens on TCP only; the engine contract is a Unix socket. The process is started through
`LAUNCHER` (written into the runner home's install), run by the environment's python: mlx_lm.server's own
`main` (its flags, model loading, request handler), with its HTTP server bound to the runner's socket
instead, and every request's `model` taken as the one model it serves (mlx_lm would otherwise load an
unknown name from the Hugging Face Hub).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modelrunner import config
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
from modelrunner.engines.gpu import GPU_KINDS
from modelrunner.engines.install import (
    InstallTracker,
    cached_or_made,
    engine_cache_root,
    folder_size,
    remove_install,
    staged_folder,
)
from modelrunner.engines.vllm import kv_bytes, model_dir
from modelrunner.errors import BadRequest, EngineInstallError, EngineUnsupported, ModelRunnerError

NAME = "mlx"
FORMAT = "mlx"  # the engine format of a model MLX wrote (engines/registry.py engine_format)
VERSION = "0.32.4"  # MLX's release (DMR's status shows MLX's version); also the install folder's name
MLX_LM_VERSION = "0.32.2"
ENV_INFO = "modelrunner-env.json"  # written last into a cached environment: its presence means complete
INSTALL_INFO = "install.json"
LAUNCHER_FILE = "launch_mlx_lm.py"
# Measured: the server holds ~90 MB resident with the tiny test model after a 50-token chat (python, MLX,
# transformers' tokenizer); a real model's tokenizer, prefill activations and MLX's cache of freed buffers
# come on top.
MEMORY_OVERHEAD = 512 * 1024 * 1024
_VERSION_ALIASES = {None, "", "latest", VERSION}

# Run by the environment's python as `python <install>/launch_mlx_lm.py <socket> <mlx_lm.server flags>`.
LAUNCHER = r"""
import socketserver, sys, time
from mlx_lm import server

socket_path = sys.argv.pop(1)


class UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def get_request(self):
        request, _ = super().get_request()
        return request, ("local", 0)  # the handler's log line reads a client address


class TheModel(server.ModelProvider):
    def load(self, model_path, adapter_path=None, draft_model_path=None):
        return super().load("default_model", None, "default_model")


def serve_on_unix_socket(host, port, response_generator):
    # The model loads in mlx_lm's generation thread: the socket answers once it is loaded (the runner is
    # ready then), and a model that cannot load ends the process instead of leaving a server that hangs.
    while response_generator.model_provider.model is None:
        if not response_generator.generation_available():
            sys.exit("mlx_lm.server could not load the model")
        time.sleep(0.05)
    fingerprint = server.get_system_fingerprint()

    def handler(*args, **kwargs):
        return server.APIHandler(response_generator, *args, system_fingerprint=fingerprint, **kwargs)

    with UnixHTTPServer(socket_path, handler) as httpd:
        httpd.serve_forever()


server.ModelProvider = TheModel
server._run_http_server = serve_on_unix_socket
sys.argv[0] = "mlx_lm.server"
server.main()
"""

# What LAUNCHER needs of mlx_lm.server, checked when the environment is made (a new mlx-lm that renames one
# fails the install, not the first load).
_PROBE = (
    "import json, mlx.core, mlx_lm; from mlx_lm import server; "
    "[getattr(server, n) for n in ('ModelProvider', 'APIHandler', 'get_system_fingerprint', "
    "'_run_http_server', 'main')]; "
    "print(json.dumps({'mlx': mlx.core.__version__, 'mlx_lm': mlx_lm.__version__}))"
)


def requirements() -> tuple[str, ...]:
    """mlx-lm and MLX's build for this platform: on Linux `mlx` alone has no backend, its `cpu` extra
    (the `mlx-cpu` package) brings one."""
    framework = f"mlx=={VERSION}" if sys.platform == "darwin" else f"mlx[cpu]=={VERSION}"
    return (f"mlx-lm=={MLX_LM_VERSION}", framework)


def unsupported_reason() -> str | None:
    """Why MLX cannot run here, or None: MLX publishes builds for macOS arm64 and Linux x86_64."""
    machine = platform.machine()
    if sys.platform == "darwin":
        return None if machine == "arm64" else "only supported on macOS arm64 (Apple silicon)"
    if sys.platform.startswith("linux"):
        return None if machine == "x86_64" else f"MLX's Linux build is for x86_64, and this is {machine}"
    return "only supported on Linux x86_64 and macOS arm64"


def is_mlx_model(model_config: Mapping[str, Any]) -> bool:
    """Safetensors that MLX wrote: the config's `safetensors` map (the first file's `__metadata__`) says
    `format: mlx`."""
    metadata = model_config.get("safetensors")
    return isinstance(metadata, Mapping) and metadata.get("format") == "mlx"


def env_key() -> str:
    identity = {
        "requirements": requirements(),
        "python": f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}",
        "machine": platform.machine(),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"{VERSION}-{digest}"


def cache_root() -> Path:
    return engine_cache_root(NAME)


def cached_env() -> Path | None:
    """The complete cached environment, or None."""
    env = cache_root() / env_key()
    return env if (env / ENV_INFO).is_file() and (env / "bin" / "python").exists() else None


def ensure_env(progress: ProgressCallback) -> Path:
    """The cached environment, made first (under the machine-wide lock) when the cache has none."""
    waiting = "Waiting for another install of the MLX environment on this machine to finish"
    return cached_or_made(cache_root(), env_key(), waiting, progress, cached_env, lambda: _made_env(progress))


def _made_env(progress: ProgressCallback) -> Path:
    started = time.monotonic()
    final = cache_root() / env_key()
    with staged_folder(final) as staging:  # the server runs as `python -c`: the folder may be renamed
        _create_env(staging, progress)
    progress(f"Created the MLX environment in {time.monotonic() - started:.0f} s")
    return final


def _create_env(env: Path, progress: ProgressCallback) -> None:
    progress(f"Creating the MLX environment ({', '.join(requirements())}; about 370 MB)")
    _step([sys.executable, "-m", "venv", str(env)], "creating the virtual environment", env)
    python = str(env / "bin" / "python")
    progress(f"pip: installing {', '.join(requirements())}")
    _step([python, "-m", "pip", "install", "--no-input", *requirements()], "installing mlx-lm", env)
    progress("Checking that the environment imports MLX and mlx_lm's server")
    found = json.loads(_step([python, "-c", _PROBE], "checking the environment", env).splitlines()[-1])
    info = {"mlx": found["mlx"], "mlx_lm": found["mlx_lm"], "requirements": requirements()}
    (env / ENV_INFO).write_text(json.dumps(info, indent=2) + "\n")


def _step(argv: list[str], what: str, hide: Path) -> str:
    """One install step's output; EngineInstallError with its last lines (the folder hidden) when it fails.
    (vllm.py and diffusers.py each stream theirs with a private `_run`; no shared one exists yet.)"""
    pip_quiet = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_PROGRESS_BAR": "off"}
    try:
        done = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env={**os.environ, **pip_quiet},
        )
    except OSError as exc:
        raise EngineInstallError(f"{what} could not start: {exc.strerror}") from None
    lines = [line.replace(str(hide), "<env>") for line in done.stdout.splitlines()]
    if done.returncode != 0:
        tail = [line for line in lines if "is ignored: it is neither a file nor a directory" not in line]
        raise EngineInstallError(f"{what} failed (exit {done.returncode}):\n" + "\n".join(tail[-20:]))
    return "\n".join(lines)


def max_tokens(model: ModelForEngine, settings: RunnerSettings) -> int | None:
    """`--max-tokens` as DMR passes it (mlx_config.go GetMaxTokens): the configured context size, else the
    model's; None lets mlx_lm use its default."""
    for size in (settings.context_size, model.context_size):
        if size is not None and size > 0:
            return size
    return None


class MlxEngine(Engine):
    name = NAME
    formats = frozenset({FORMAT})
    modes = frozenset({Mode.COMPLETION})  # mlx_lm.server has no embeddings or reranking routes
    # mlx_lm stops a generation whose client left only while it streams (a write fails); an unstreamed answer
    # is written whole at the end, so the daemon asks for a stream and assembles it (compat/assemble.py)
    assembles_unstreamed = True

    def __init__(self, install_root: Path | None = None) -> None:
        self._install_root = install_root  # None: <runner home>/engines/mlx, read when needed
        self._lock = threading.Lock()
        self._tracker = InstallTracker()

    @property
    def install_root(self) -> Path:
        return self._install_root or config.runner_home() / "engines" / NAME

    @property
    def install_dir(self) -> Path:
        return self.install_root / VERSION

    @property
    def python(self) -> Path:
        return self.install_dir / "venv" / "bin" / "python"

    # -- install state -------------------------------------------------------------------------------

    def _install_problem(self) -> str | None:
        """Why the runner home's install cannot run a server, or None when it can."""
        if not (self.install_dir / INSTALL_INFO).is_file():
            return "not installed"
        if not self.python.exists():
            return "its environment is gone from the cache; run: model reinstall-runner --backend mlx"
        try:
            launcher = (self.install_dir / LAUNCHER_FILE).read_text()
        except OSError:
            launcher = None
        if launcher != LAUNCHER:
            return "installed by another modelrunner version; run: model reinstall-runner --backend mlx"
        return None

    def status(self) -> EngineStatus:
        installing = self._tracker.status_now()
        if installing:
            return installing
        problem = self._install_problem()
        if problem is None:
            return EngineStatus(InstallState.RUNNING, version=VERSION)
        if problem != "not installed":
            return EngineStatus(InstallState.ERROR, detail=problem)
        reason = unsupported_reason()
        if reason:
            return EngineStatus(InstallState.NOT_INSTALLED, detail=reason)
        not_installed = EngineStatus(InstallState.NOT_INSTALLED, detail="no MLX environment installed")
        return self._tracker.failed_or(not_installed)

    def prepare_install(self, gpu: str = "auto", version: str | None = None) -> None:
        if gpu not in GPU_KINDS:
            raise BadRequest(f"unknown --gpu value {gpu!r}: use one of {', '.join(GPU_KINDS)}")
        reason = unsupported_reason()
        if reason:
            raise EngineUnsupported(f"mlx cannot be installed: {reason}")
        if gpu in ("cuda", "vulkan"):
            raise EngineUnsupported(f"this model runner installs MLX's CPU build: use --gpu none, not {gpu}")
        if version not in _VERSION_ALIASES:
            raise BadRequest(f"mlx version {version!r} is not available: this model runner pins {VERSION}")

    def install(self, progress: ProgressCallback, gpu: str = "auto", force: bool = False) -> EngineStatus:
        self.prepare_install(gpu)
        with self._lock, self._tracker.running(f"installing mlx {VERSION}"):
            if not force and self._install_problem() is None:
                progress(f"mlx {VERSION} is already installed")
            else:
                env = cached_env()
                if env is not None:
                    progress(f"Using the cached MLX environment ({env.name})")
                self._place(env or ensure_env(progress))
                progress(f"Installed mlx {VERSION} (mlx-lm {MLX_LM_VERSION})")
        return self.status()

    def _place(self, env: Path) -> None:
        """`<install root>/<version>/`: a link to the cached environment, the launcher, install.json."""
        from filelock import FileLock

        root = self.install_root
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root.parent / f".{NAME}.lock")), staged_folder(self.install_dir) as staging:
            (staging / "venv").symlink_to(env, target_is_directory=True)
            (staging / LAUNCHER_FILE).write_text(LAUNCHER)
            info = {"version": VERSION, "mlx_lm": MLX_LM_VERSION, "env": env.name}
            (staging / INSTALL_INFO).write_text(json.dumps(info) + "\n")

    def uninstall(self) -> None:
        """Removes the runner home's install; the machine's cached environment stays for other homes."""
        with self._lock:
            remove_install(self.install_root, self.install_root.parent / f".{NAME}.lock")

    def disk_usage(self) -> int:
        return folder_size(self.install_root)  # not the shared environment the install links to

    # -- runners -------------------------------------------------------------------------------------

    def validate_runtime_flags(self, flags: list[str]) -> None:
        if flags:  # DMR's MLX backend passes none either (mlx_config.go GetArgs)
            raise BadRequest("the mlx engine takes no runtime flags")

    def launch_spec(
        self, model: ModelForEngine, mode: Mode, settings: RunnerSettings, socket: Path
    ) -> LaunchSpec:
        if mode not in self.modes:
            raise BadRequest(f"mlx cannot serve {mode.value} requests")
        if model.format != "safetensors":
            raise BadRequest(f"mlx needs an MLX safetensors model, and {model.reference} is {model.format}")
        self.validate_runtime_flags(list(settings.runtime_flags))
        self.require_installed()
        launcher = self.install_dir / LAUNCHER_FILE
        argv = [str(self.python), str(launcher), str(socket), "--model", str(model_dir(model.bundle))]
        limit = max_tokens(model, settings)
        if limit is not None:
            argv += ["--max-tokens", str(limit)]
        env = {
            "PYTHONNOUSERSITE": "1",  # the user's site-packages must not shadow the pinned environment
            "PYTHONUNBUFFERED": "1",  # the engine log shows lines as they happen
            "HF_HUB_OFFLINE": "1",  # the model is all in the bundle: never reach out to a hub
        }
        return LaunchSpec(argv=argv, socket=socket, env=env, health_path="/health")

    def estimate_memory(self, model: ModelForEngine, settings: RunnerSettings) -> int:
        """The weights (loaded as stored: MLX keeps quantized weights quantized), one full-context
        sequence's KV cache (mlx_lm grows it as the sequence does), and the process's own."""
        folder = model_dir(model.bundle)
        weights = sum(path.stat().st_size for path in folder.rglob("*.safetensors"))
        context = max_tokens(model, settings)
        return weights + kv_bytes(folder, context, None) + MEMORY_OVERHEAD


def main(argv: list[str] | None = None) -> int:
    """`python -m modelrunner.engines.mlx`: make the machine's cached environment (scripts/test-setup runs
    it once before the tests); where MLX cannot run, say why and succeed."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m modelrunner.engines.mlx", description="Make the cached MLX environment."
    )
    parser.parse_args(argv)
    reason = unsupported_reason()
    if reason:
        print(f"Skipped: {reason}")
        return 0
    started = time.monotonic()
    try:
        env = ensure_env(lambda line: print(line, flush=True))
    except ModelRunnerError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        return 1
    print(f"MLX environment {env.name} ready after {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
