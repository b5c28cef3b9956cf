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

import json
import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modelrunner.engines.base import (
    Engine,
    EngineStatus,
    LaunchSpec,
    Mode,
    ModelForEngine,
    ProgressCallback,
    RunnerSettings,
)
from modelrunner.engines.gpu import GPU_KINDS
from modelrunner.engines.install import CachedEnv, LinkedInstall, env_key, pip_progress, run_step
from modelrunner.engines.vllm import kv_bytes, model_dir
from modelrunner.errors import BadRequest, EngineUnsupported, ModelRunnerError

NAME = "mlx"
FORMAT = "mlx"  # the engine format of a model MLX wrote (engines/registry.py engine_format)
VERSION = "0.32.4"  # MLX's release (DMR's status shows MLX's version); also the install folder's name
MLX_LM_VERSION = "0.32.2"
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


def environment() -> CachedEnv:
    """The machine's cached environment (key: the pins, Python, architecture)."""
    return CachedEnv(NAME, env_key(VERSION, {"requirements": requirements()}), "the MLX environment")


def ensure_env(progress: ProgressCallback) -> Path:
    """The cached environment, made first (under the machine-wide lock) when the cache has none."""
    return environment().ensure(progress, lambda env: _create_env(env, progress))


def _create_env(env: Path, progress: ProgressCallback) -> dict[str, Any]:
    progress(f"Creating the MLX environment ({', '.join(requirements())}; about 370 MB)")
    run_step([sys.executable, "-m", "venv", str(env)], "creating the virtual environment", env)
    python = str(env / "bin" / "python")
    progress(f"pip: installing {', '.join(requirements())}")
    argv = [python, "-m", "pip", "install", "--no-input", *requirements()]
    run_step(argv, "installing mlx-lm", env, on_line=pip_progress(progress))
    progress("Checking that the environment imports MLX and mlx_lm's server")
    found = json.loads(run_step([python, "-c", _PROBE], "checking the environment", env).splitlines()[-1])
    return {"mlx": found["mlx"], "mlx_lm": found["mlx_lm"], "requirements": requirements()}


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
    # no runtime flags (`flag_rules` None): DMR's MLX backend passes none either (mlx_config.go GetArgs)

    def __init__(self, install_root: Path | None = None) -> None:
        self.home = LinkedInstall(NAME, VERSION, install_root)

    @property
    def install_root(self) -> Path:
        return self.home.root

    @property
    def install_dir(self) -> Path:
        return self.home.folder

    @property
    def python(self) -> Path:
        return self.home.python

    # -- install state -------------------------------------------------------------------------------

    def _install_problem(self) -> str | None:
        """Why the runner home's install cannot run a server, or None when it can."""
        return self.home.problem(lambda _: self._launcher() == LAUNCHER)

    def _launcher(self) -> str | None:
        try:
            return (self.install_dir / LAUNCHER_FILE).read_text()
        except OSError:
            return None

    def status(self) -> EngineStatus:
        nothing = "no MLX environment installed"
        return self.home.status(self._install_problem(), VERSION, nothing, unsupported_reason)

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
        with self.home.installing(f"installing mlx {VERSION}"):
            if not force and self._install_problem() is None:
                progress(f"mlx {VERSION} is already installed")
            else:
                env = environment().found()
                if env is not None:
                    progress(f"Using the cached MLX environment ({env.name})")
                env = env or ensure_env(progress)
                info = {"version": VERSION, "mlx_lm": MLX_LM_VERSION, "env": env.name}
                self.home.place(env, info, lambda install: (install / LAUNCHER_FILE).write_text(LAUNCHER))
                progress(f"Installed mlx {VERSION} (mlx-lm {MLX_LM_VERSION})")
        return self.status()

    def uninstall(self) -> None:
        """Removes the runner home's install; the machine's cached environment stays for other homes."""
        self.home.remove()

    def disk_usage(self) -> int:
        return self.home.disk_usage()

    # -- runners -------------------------------------------------------------------------------------

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
