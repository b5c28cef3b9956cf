"""The diffusers engine: our `diffusers_server` serving one DDUF image pipeline on a Unix socket.

The environment (torch, diffusers, transformers, fastapi, uvicorn, ... pinned below) is ~1.3 GB and takes
about a minute of pip, so it is built once per machine in `${XDG_CACHE_HOME:-~/.cache}/modelrunner/
diffusers/<key>/`, keyed by the pins, the flavour (cpu | cuda) and the Python version, and shared: an install
into a runner home (`<home>/engines/diffusers/<version>/`) is a link to that environment plus a copy of
the server package, so a second home installs in well under a second and uses no more disk. The copy (not a
path into this source tree) keeps a runner home working whatever happens to the source, and lets
`status` notice a server from another modelrunner version.

`python -m modelrunner.engines.diffusers [--gpu none|cuda|auto]` fills the cache (CI runs it once).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from modelrunner.engines import install
from modelrunner.engines.base import (
    Engine,
    EngineStatus,
    LaunchSpec,
    Mode,
    ModelForEngine,
    ProgressCallback,
    RunnerSettings,
)
from modelrunner.engines.gpu import GPU_KINDS, detect_accelerator
from modelrunner.engines.install import ENV_INFO as ENV_INFO  # what marks a cached environment complete
from modelrunner.engines.install import (
    CachedEnv,
    LinkedInstall,
    engine_cache_root,
    pip_progress,
    run_step,
)
from modelrunner.errors import BadRequest, EngineInstallError, EngineUnsupported, ModelRunnerError

NAME = "diffusers"
VERSION = "0.42.1"  # the diffusers release the environment pins; also the install folder's name
# torch first and alone: on CPU the pinned build comes from the machine's wheel store, and an unpinned or
# later-resolved torch would pull a multi-GB CUDA build.
TORCH_REQUIREMENT = "torch==2.13.0"
REQUIREMENTS = (
    f"diffusers=={VERSION}",
    "transformers==5.24.0",
    "accelerate==1.15.0",
    "safetensors==0.8.0",
    "huggingface_hub==2.4.0",
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "pillow==13.0.0",
)
SERVER_PACKAGE = "modelrunner.engines.diffusers_server"
SERVER_SOURCE = Path(__file__).with_name("diffusers_server")
# Measured: the tiny test pipeline's server holds ~420 MB resident after a 64x64 image (torch, diffusers and
# transformers loaded). Weights then count twice: fp16 files load as fp32 on the CPU, and fp32 ones need
# room for activations at 512x512.
MEMORY_OVERHEAD = 512 * 1024 * 1024
WEIGHTS_FACTOR = 2.0
_VERSION_ALIASES = {None, "", "latest", VERSION}


def resolve_flavour(gpu: str) -> str:
    """`--gpu` to the torch build: "cuda" (the CUDA wheel, needs an NVIDIA driver) or "cpu"."""
    if gpu not in GPU_KINDS:
        raise BadRequest(f"unknown --gpu value {gpu!r}: use one of {', '.join(GPU_KINDS)}")
    if gpu == "vulkan":
        raise EngineUnsupported("PyTorch has no Vulkan build: use --gpu cuda or --gpu none for diffusers")
    has_cuda = gpu in ("auto", "cuda") and detect_accelerator().kind == "cuda"
    if gpu == "cuda" and not has_cuda:
        raise EngineUnsupported(
            "--gpu cuda needs an NVIDIA GPU and its driver, and none was found; use --gpu none"
        )
    return "cuda" if has_cuda else "cpu"


def env_key(flavour: str) -> str:
    identity = {"torch": TORCH_REQUIREMENT, "requirements": REQUIREMENTS, "flavour": flavour}
    return install.env_key(f"{VERSION}-{flavour}", identity)


def environment(flavour: str) -> CachedEnv:
    """The machine's cached environment for flavour ("cpu" | "cuda")."""
    return CachedEnv(NAME, env_key(flavour), "the diffusers environment")


def cached_env(flavour: str) -> Path | None:
    """The complete cached environment for flavour, or None."""
    return environment(flavour).found()


def cache_root() -> Path:
    return engine_cache_root(NAME)


def ensure_env(flavour: str, progress: ProgressCallback) -> Path:
    """The cached environment for flavour, creating it first when the cache has none."""
    return environment(flavour).ensure(progress, lambda env: _create_env(env, flavour, progress))


def _create_env(env: Path, flavour: str, progress: ProgressCallback) -> dict[str, Any]:
    torch_note = "CPU" if flavour == "cpu" else "CUDA"
    progress(f"Creating the diffusers environment (torch 2.13.0 {torch_note}, diffusers {VERSION}; ~1.3 GB)")
    run_step([sys.executable, "-m", "venv", str(env)], "creating the virtual environment", env)
    python = str(env / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--no-input"]
    # on CUDA, a local wheel store holds the CPU build, which would win
    pip_env = {"PIP_FIND_LINKS": ""} if flavour == "cuda" else {}
    progress(f"pip: installing {TORCH_REQUIREMENT} ({torch_note} build)")
    run_step([*pip, TORCH_REQUIREMENT], "installing torch", env, on_line=pip_progress(progress), env=pip_env)
    progress(f"pip: installing {', '.join(REQUIREMENTS)}")
    argv = [*pip, TORCH_REQUIREMENT, *REQUIREMENTS]
    run_step(argv, "installing diffusers", env, on_line=pip_progress(progress), env=pip_env)
    progress("Checking that the environment imports torch and diffusers")
    probe = "import json, torch, diffusers, transformers, fastapi, uvicorn, PIL; "
    probe += "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda}))"
    found = json.loads(run_step([python, "-c", probe], "checking the environment", env).splitlines()[-1])
    if flavour == "cuda" and not found.get("cuda"):
        raise EngineInstallError("pip installed a torch without CUDA; install with --gpu none, or check pip")
    return {"diffusers": VERSION, "flavour": flavour, "torch": found["torch"], "requirements": REQUIREMENTS}


def server_digest(source: Path = SERVER_SOURCE) -> str:
    """Identity of the server package's code, to tell whether an install carries this version of it."""
    digest = hashlib.sha256()
    for path in sorted(source.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def find_dduf(bundle: Path) -> Path:
    files = sorted((bundle / "model").glob("*.dduf"))
    if not files:
        raise ModelRunnerError("the model's bundle has no DDUF file: remove the model and pull it again")
    return files[0]


def _add_server(install: Path) -> None:
    """Only the server package, under its own import name: nothing else of modelrunner is there."""
    package = install / "server" / Path(*SERVER_PACKAGE.split("."))
    shutil.copytree(SERVER_SOURCE, package, ignore=shutil.ignore_patterns("__pycache__"))
    for parent in (package.parent, package.parent.parent):
        (parent / "__init__.py").touch()


class DiffusersEngine(Engine):
    name = NAME
    formats = frozenset({"dduf", "diffusers"})
    modes = frozenset({Mode.IMAGE_GENERATION})
    assembles_unstreamed = False  # it generates images: there is no stream to assemble

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
        """Why the install in the runner home cannot run a server, or None when it can."""
        return self.home.problem(lambda info: info.get("server") == server_digest())

    def status(self) -> EngineStatus:
        return self.home.status(self._install_problem(), VERSION, "no diffusers environment installed")

    def prepare_install(self, gpu: str = "auto", version: str | None = None) -> None:
        if version not in _VERSION_ALIASES:
            raise BadRequest(
                f"diffusers version {version!r} is not available: this model runner pins {VERSION}"
            )
        resolve_flavour(gpu)

    def install(self, progress: ProgressCallback, gpu: str = "auto", force: bool = False) -> EngineStatus:
        flavour = resolve_flavour(gpu)
        with self.home.installing(f"installing diffusers {VERSION}"):
            self._install(flavour, progress, force)
        return self.status()

    def _install(self, flavour: str, progress: ProgressCallback, force: bool) -> None:
        installed = self.home.info() if not force and self._install_problem() is None else None
        if installed is not None and installed.get("flavour") == flavour:
            progress(f"diffusers {VERSION} is already installed")
            return
        env = cached_env(flavour)
        if env is not None:
            progress(f"Using the cached diffusers environment ({env.name})")
        else:
            env = ensure_env(flavour, progress)
        info = {"version": VERSION, "flavour": flavour, "env": env.name, "server": server_digest()}
        self.home.place(env, info, _add_server)
        progress(f"Installed diffusers {VERSION} ({flavour})")

    def uninstall(self) -> None:
        """Removes the runner home's install; the machine's cached environment stays for other homes."""
        self.home.remove()

    def disk_usage(self) -> int:
        return self.home.disk_usage()

    # -- runners -------------------------------------------------------------------------------------

    def launch_spec(
        self, model: ModelForEngine, mode: Mode, settings: RunnerSettings, socket: Path
    ) -> LaunchSpec:
        if mode is not Mode.IMAGE_GENERATION:
            raise BadRequest(
                f"{model.reference} is an image model: use /v1/images/generations, not {mode.value} requests"
            )
        if model.format not in self.formats:
            raise BadRequest(f"diffusers needs a DDUF model, and {model.reference} is {model.format}")
        self.validate_runtime_flags(list(settings.runtime_flags))
        self.require_installed()
        argv = [str(self.python), "-m", SERVER_PACKAGE, "--model-path", str(find_dduf(model.bundle))]
        argv += ["--uds", str(socket), "--served-model-name", model.reference, model.id]
        env = {
            "PYTHONPATH": str(self.install_dir / "server"),
            "PYTHONNOUSERSITE": "1",  # the user's site-packages must not shadow the pinned environment
            "PYTHONUNBUFFERED": "1",  # the engine log shows lines as they happen
            "HF_HUB_OFFLINE": "1",  # the pipeline is all in the DDUF: never reach out to a hub
        }
        return LaunchSpec(argv=argv, socket=socket, env=env)

    def estimate_memory(self, model: ModelForEngine, settings: RunnerSettings) -> int:
        return MEMORY_OVERHEAD + int(WEIGHTS_FACTOR * model.size_bytes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modelrunner.engines.diffusers",
        description="Create the diffusers environment in the cache (what install-runner then links).",
    )
    parser.add_argument("--gpu", default="auto", choices=("auto", "none", "cuda"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        flavour = resolve_flavour(args.gpu)
        env = ensure_env(flavour, lambda line: print(line, flush=True))
    except ModelRunnerError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        return 1
    print(f"diffusers environment {env.name} ready after {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
