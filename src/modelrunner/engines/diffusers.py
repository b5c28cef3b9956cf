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
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

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
from modelrunner.engines.gpu import GPU_KINDS, detect_accelerator
from modelrunner.engines.install import (
    InstallTracker,
    cached_or_made,
    engine_cache_root,
    folder_size,
    remove_install,
    staged_folder,
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
ENV_INFO = "modelrunner-env.json"  # written last into a cached environment: its presence means complete
INSTALL_INFO = "install.json"
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
    identity = {
        "torch": TORCH_REQUIREMENT,
        "requirements": REQUIREMENTS,
        "flavour": flavour,
        "python": f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}",
        "machine": os.uname().machine,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"{VERSION}-{flavour}-{digest}"


def cache_root() -> Path:
    return engine_cache_root(NAME)


def cached_env(flavour: str) -> Path | None:
    """The complete cached environment for flavour, or None."""
    env = cache_root() / env_key(flavour)
    return env if (env / ENV_INFO).is_file() and (env / "bin" / "python").exists() else None


def ensure_env(flavour: str, progress: ProgressCallback) -> Path:
    """The cached environment for flavour ("cpu" | "cuda"), creating it first when the cache has none."""
    waiting = "Waiting for another install of the diffusers environment on this machine to finish"
    key = env_key(flavour)
    return cached_or_made(
        cache_root(),
        key,
        waiting,
        progress,
        lambda: cached_env(flavour),
        lambda: _made_env(key, flavour, progress),
    )


def _made_env(key: str, flavour: str, progress: ProgressCallback) -> Path:
    started = time.monotonic()
    # Built under a temporary name and renamed: the server runs as `python -m`, which does not care
    # where the environment was created (only the pip/uvicorn launcher scripts would).
    final = cache_root() / key
    with staged_folder(final) as staging:  # replaces an incomplete one (no ENV_INFO)
        _create_env(staging, flavour, progress)
    progress(f"Created the diffusers environment in {time.monotonic() - started:.0f} s")
    return final


def _create_env(env: Path, flavour: str, progress: ProgressCallback) -> None:
    torch_note = "CPU" if flavour == "cpu" else "CUDA"
    progress(f"Creating the diffusers environment (torch 2.13.0 {torch_note}, diffusers {VERSION}; ~1.3 GB)")
    _run([sys.executable, "-m", "venv", str(env)], "creating the virtual environment", env, progress)
    python = str(env / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    pip_env = dict(os.environ)
    if flavour == "cuda":
        pip_env["PIP_FIND_LINKS"] = ""  # a local wheel store holds the CPU build, which would win
    progress(f"pip: installing {TORCH_REQUIREMENT} ({torch_note} build)")
    _run([*pip, TORCH_REQUIREMENT], "installing torch", env, progress, pip_env)
    progress(f"pip: installing {', '.join(REQUIREMENTS)}")
    _run([*pip, TORCH_REQUIREMENT, *REQUIREMENTS], "installing diffusers", env, progress, pip_env)
    progress("Checking that the environment imports torch and diffusers")
    probe = "import json, torch, diffusers, transformers, fastapi, uvicorn, PIL; "
    probe += "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda}))"
    found = json.loads(
        _run([python, "-c", probe], "checking the environment", env, progress).splitlines()[-1]
    )
    if flavour == "cuda" and not found.get("cuda"):
        raise EngineInstallError("pip installed a torch without CUDA; install with --gpu none, or check pip")
    info = {"diffusers": VERSION, "flavour": flavour, "torch": found["torch"], "requirements": REQUIREMENTS}
    (env / ENV_INFO).write_text(json.dumps(info, indent=2) + "\n")


def _run(
    argv: list[str],
    what: str,
    hide: Path,
    progress: ProgressCallback,
    env: dict[str, str] | None = None,
) -> str:
    """Run a step; pip's main lines become progress. On failure the error carries the output's end."""
    tail: deque[str] = deque(maxlen=20)
    out: list[str] = []
    try:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=env,
        )
    except OSError as exc:
        raise EngineInstallError(f"{what} could not start: {exc.strerror}") from None
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.rstrip().replace(str(hide), "<env>")
        if "is ignored: it is neither a file nor a directory" in line:
            continue  # pip's noise about index folders that lack a package
        out.append(line)
        tail.append(line)
        if line.startswith(("Collecting ", "Downloading ", "Installing collected", "Successfully installed")):
            progress("pip: " + line[:200])
    if process.wait() != 0:
        raise EngineInstallError(f"{what} failed (exit {process.returncode}):\n" + "\n".join(tail))
    return "\n".join(out)


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


class DiffusersEngine(Engine):
    name = NAME
    formats = frozenset({"dduf", "diffusers"})
    modes = frozenset({Mode.IMAGE_GENERATION})
    assembles_unstreamed = False  # it generates images: there is no stream to assemble

    def __init__(self, install_root: Path | None = None) -> None:
        self._install_root = install_root  # None: <runner home>/engines/diffusers, read when needed
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
        """Why the install in the runner home cannot run a server, or None when it can."""
        try:
            info = json.loads((self.install_dir / INSTALL_INFO).read_text())
        except (OSError, ValueError):
            return "not installed"
        if not self.python.exists():
            return "its environment is gone from the cache; run: model reinstall-runner --backend diffusers"
        if info.get("server") != server_digest():
            return "installed by another modelrunner version; run: model reinstall-runner --backend diffusers"
        return None

    def status(self) -> EngineStatus:
        installing = self._tracker.status_now()
        if installing:
            return installing
        problem = self._install_problem()
        if problem is None:
            return EngineStatus(InstallState.RUNNING, version=VERSION)
        if problem == "not installed":
            not_installed = EngineStatus(
                InstallState.NOT_INSTALLED, detail="no diffusers environment installed"
            )
            return self._tracker.failed_or(not_installed)
        return EngineStatus(InstallState.ERROR, detail=problem)

    def prepare_install(self, gpu: str = "auto", version: str | None = None) -> None:
        if version not in _VERSION_ALIASES:
            raise BadRequest(
                f"diffusers version {version!r} is not available: this model runner pins {VERSION}"
            )
        resolve_flavour(gpu)

    def install(self, progress: ProgressCallback, gpu: str = "auto", force: bool = False) -> EngineStatus:
        flavour = resolve_flavour(gpu)
        with self._lock, self._tracker.running(f"installing diffusers {VERSION}"):
            self._install(flavour, progress, force)
        return self.status()

    def _install(self, flavour: str, progress: ProgressCallback, force: bool) -> None:
        if not force and self._install_problem() is None:
            installed = json.loads((self.install_dir / INSTALL_INFO).read_text())
            if installed.get("flavour") == flavour:
                progress(f"diffusers {VERSION} is already installed")
                return
        env = cached_env(flavour)
        if env is not None:
            progress(f"Using the cached diffusers environment ({env_key(flavour)})")
        else:
            env = ensure_env(flavour, progress)
        self._place(env, flavour)
        progress(f"Installed diffusers {VERSION} ({flavour})")

    def _place(self, env: Path, flavour: str) -> None:
        """`<install root>/<version>/`: a link to the environment, the server package, install.json."""
        from filelock import FileLock

        root = self.install_root
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root.parent / f".{NAME}.lock")), staged_folder(self.install_dir) as staging:
            (staging / "venv").symlink_to(env, target_is_directory=True)
            # Only the server package, under its own import name: nothing else of modelrunner is there.
            package = staging / "server" / Path(*SERVER_PACKAGE.split("."))
            shutil.copytree(SERVER_SOURCE, package, ignore=shutil.ignore_patterns("__pycache__"))
            for parent in (package.parent, package.parent.parent):
                (parent / "__init__.py").touch()
            info = {"version": VERSION, "flavour": flavour, "env": env.name, "server": server_digest()}
            (staging / INSTALL_INFO).write_text(json.dumps(info) + "\n")

    def uninstall(self) -> None:
        """Removes the runner home's install; the machine's cached environment stays for other homes."""
        with self._lock:
            remove_install(self.install_root, self.install_root.parent / f".{NAME}.lock")

    def disk_usage(self) -> int:
        return folder_size(self.install_root)  # not the shared environment the install links to

    # -- runners -------------------------------------------------------------------------------------

    def validate_runtime_flags(self, flags: list[str]) -> None:
        if flags:
            raise BadRequest("the diffusers engine takes no runtime flags")

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
