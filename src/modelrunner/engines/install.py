"""What every engine's installer shares: the machine-wide cache of builds and environments (an entry is
looked for, else made under its lock), the one way an install step runs (`run_step`), the install in a
runner home (`HomeInstall`: its folder, its locks, and the bookkeeping that lets status() say "Installing"
during an install and "install failed: ..." after a failed one), and the Python environments made once per
machine that a runner home's install links to (`CachedEnv`, `LinkedInstall`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from modelrunner import config
from modelrunner.engines.base import EngineStatus, InstallState, ProgressCallback
from modelrunner.errors import EngineInstallError, ModelRunnerError

_Found = TypeVar("_Found")


def engine_cache_base() -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/modelrunner`: the engine caches of every engine (and tool)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "modelrunner"


def engine_cache_root(name: str) -> Path:
    """The machine-wide cache of one engine (or tool), shared by every runner home of this user: a build
    or an environment is made once per machine and recipe, not once per home."""
    return engine_cache_base() / name


@contextlib.contextmanager
def cache_lock(root: Path, key: str, waiting: str, progress: Callable[[str], None]) -> Iterator[None]:
    """Hold the machine-wide lock on the cache entry `key` under root; say `waiting` when another install
    holds it first."""
    from filelock import FileLock, Timeout

    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / f".{key}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress(waiting)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def cached_or_made(
    root: Path,
    key: str,
    waiting: str,
    progress: Callable[[str], None],
    cached: Callable[[], _Found | None],
    make: Callable[[], _Found],
) -> _Found:
    """The cache entry `key` as `cached` finds it complete; else made by `make` under the entry's lock. It
    is looked for again once the lock is held: whoever held it first may have made it."""
    found = cached()
    if found is not None:
        return found
    with cache_lock(root, key, waiting, progress):
        found = cached()
        return found if found is not None else make()


@contextlib.contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """A folder filled under a temporary name next to `final`, then renamed into place (replacing what was
    there: an incomplete or older entry); removed if filling it fails, so `final` is never half-made."""
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; engines are not secrets
        yield staging
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class InstallTracker:
    def __init__(self) -> None:
        self.installing: str | None = None  # what is being installed, while it is
        self.last_error: str | None = None

    @contextlib.contextmanager
    def running(self, what: str) -> Iterator[None]:
        self.installing = what
        try:
            yield
            self.last_error = None
        except ModelRunnerError as exc:
            self.last_error = exc.message.splitlines()[0]
            raise
        except Exception as exc:
            self.last_error = exc.__class__.__name__  # its text may hold paths; the daemon log has it
            raise
        finally:
            self.installing = None

    def status_now(self) -> EngineStatus | None:
        """Installing, if an install runs; else None (the engine then looks at what is on disk)."""
        return EngineStatus(InstallState.INSTALLING, detail=self.installing) if self.installing else None

    def failed_or(self, not_installed: EngineStatus) -> EngineStatus:
        """For an engine with nothing installed: the last install's failure, if there was one."""
        if self.last_error:
            return EngineStatus(InstallState.ERROR, detail=f"install failed: {self.last_error}")
        return not_installed


def folder_size(root: Path) -> int:
    """Bytes of the files under root; links (e.g. to a shared cached environment) are not followed."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


# -- one install step -----------------------------------------------------------------------------------

_PIP_QUIET = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_PROGRESS_BAR": "off"}
# pip's notes on each local wheel folder that lacks a package: noise, in progress and in an error's tail
_NOISE = ("WARNING: Location", "is ignored: it is neither a file nor a directory")
_PIP_NEWS = ("Collecting ", "Downloading ", "Installing collected", "Successfully installed")


def run_step(
    argv: list[str],
    what: str,
    hide: Path,
    shown_as: str = "<env>",
    on_line: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run one install step (a venv, pip, a probe, a compiler) and return its output; each line goes to
    `on_line` as it comes. EngineInstallError when it cannot start or fails, with its last lines. The
    folder `hide` is written `shown_as` everywhere: an error never shows the machine's paths. `env`: added
    to this process's environment (pip is kept quiet)."""
    tail: deque[str] = deque(maxlen=25)
    out: list[str] = []
    try:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env={**os.environ, **_PIP_QUIET, **(env or {})},
        )
    except OSError as exc:
        raise EngineInstallError(f"{what} could not start ({Path(argv[0]).name}: {exc.strerror})") from None
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.rstrip().replace(str(hide), shown_as)
        if any(noise in line for noise in _NOISE):
            continue
        out.append(line)
        tail.append(line)
        if on_line is not None:
            on_line(line)
    if process.wait() != 0:
        raise EngineInstallError(f"{what} failed (exit {process.returncode}):\n" + "\n".join(tail))
    return "\n".join(out)


def pip_progress(progress: ProgressCallback) -> Callable[[str], None]:
    """`on_line` for a pip step: its main lines (a package collected, downloaded, installed) as progress."""

    def on_line(line: str) -> None:
        text = line.strip()
        if text.startswith(_PIP_NEWS):
            progress("pip: " + (text if len(text) < 200 else text[:197] + "..."))

    return on_line


# -- a runner home's install ----------------------------------------------------------------------------

INSTALL_INFO = "install.json"  # an install's record in the runner home
NOT_INSTALLED = "not installed"  # the problem of a runner home without an install


class HomeInstall:
    """One engine's install in a runner home (`<home>/engines/<name>/`): its folder, the lock of this
    daemon's installs and the machine-wide one of every home's, and what status() says meanwhile."""

    def __init__(self, name: str, root: Path | None) -> None:
        self.name = name
        self._root = root  # None: <runner home>/engines/<name>, read when needed
        self._lock = threading.Lock()
        self.tracker = InstallTracker()

    @property
    def root(self) -> Path:
        return self._root or config.runner_home() / "engines" / self.name

    @property
    def lock_file(self) -> Path:
        return self.root.parent / f".{self.name}.lock"

    @contextlib.contextmanager
    def installing(self, what: str) -> Iterator[None]:
        """One install at a time; status() says `what` meanwhile, and why it failed afterwards."""
        with self._lock, self.tracker.running(what):
            yield

    @contextlib.contextmanager
    def locked(self) -> Iterator[Path]:
        """The runner home's install root, under the lock every home's installs and removals take."""
        from filelock import FileLock

        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.lock_file)):
            yield self.root

    def status(
        self,
        problem: str | None,
        version: str | None,
        nothing: str,
        unsupported: Callable[[], str | None] = lambda: None,
    ) -> EngineStatus:
        """Installing while an install runs; else Running `version` when there is no `problem`; an Error
        saying it for a broken install; for none (NOT_INSTALLED), why it cannot run here, the last
        install's failure, or `nothing`."""
        installing = self.tracker.status_now()
        if installing:
            return installing
        if problem is None:
            return EngineStatus(InstallState.RUNNING, version=version)
        if problem != NOT_INSTALLED:
            return EngineStatus(InstallState.ERROR, detail=problem)
        reason = unsupported()
        if reason:
            return EngineStatus(InstallState.NOT_INSTALLED, detail=reason)
        return self.tracker.failed_or(EngineStatus(InstallState.NOT_INSTALLED, detail=nothing))

    def remove(self) -> None:
        """Remove the runner home's install (a machine's cached environment stays for other homes)."""
        from filelock import FileLock

        with self._lock:
            if self.root.exists():
                with FileLock(str(self.lock_file)):
                    shutil.rmtree(self.root)

    def disk_usage(self) -> int:
        return folder_size(self.root)  # links (to a shared cached environment) are not followed


# -- environments made once per machine, linked from each runner home ----------------------------------

ENV_INFO = "modelrunner-env.json"  # written last into a cached environment: its presence means complete


def env_key(prefix: str, identity: Mapping[str, Any]) -> str:
    """The cache key of an environment: `prefix` and a digest of what makes it (its pins, flavour, ...),
    this Python and this architecture."""
    python = f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}"
    whole = {**identity, "python": python, "machine": platform.machine()}
    digest = hashlib.sha256(json.dumps(whole, sort_keys=True).encode()).hexdigest()[:12]
    return f"{prefix}-{digest}"


@dataclass(frozen=True)
class CachedEnv:
    """A Python environment in the machine's engine cache (`<cache>/<engine>/<key>/`): made once, under
    the entry's lock, in a staged folder renamed into place (an engine runs its python as `python -m` or
    `python <file>`, which does not care where the environment was created)."""

    engine: str
    key: str
    noun: str  # what progress calls it, e.g. "the MLX environment"

    @property
    def folder(self) -> Path:
        return engine_cache_root(self.engine) / self.key

    def found(self) -> Path | None:
        """The environment when complete, or None."""
        env = self.folder
        return env if (env / ENV_INFO).is_file() and (env / "bin" / "python").exists() else None

    def ensure(self, progress: ProgressCallback, create: Callable[[Path], Mapping[str, Any]]) -> Path:
        """The environment, made first when the cache has none: `create(folder)` fills a new one and
        returns what ENV_INFO records."""
        waiting = f"Waiting for another install of {self.noun} on this machine to finish"
        root = engine_cache_root(self.engine)
        return cached_or_made(
            root, self.key, waiting, progress, self.found, lambda: self._made(progress, create)
        )

    def _made(self, progress: ProgressCallback, create: Callable[[Path], Mapping[str, Any]]) -> Path:
        started = time.monotonic()
        with staged_folder(self.folder) as staging:  # replaces an incomplete one (no ENV_INFO)
            info = create(staging)
            (staging / ENV_INFO).write_text(json.dumps(info, indent=2) + "\n")
        progress(f"Created {self.noun} in {time.monotonic() - started:.0f} s")
        return self.folder


class LinkedInstall(HomeInstall):
    """A runner home's install of a cached environment: `<root>/<version>/` holds `venv` (a link to the
    environment), what the engine adds (its server code, a launcher) and INSTALL_INFO, made in a staged
    folder under the lock."""

    def __init__(self, name: str, version: str, root: Path | None) -> None:
        super().__init__(name, root)
        self.version = version

    @property
    def folder(self) -> Path:
        return self.root / self.version

    @property
    def python(self) -> Path:
        return self.folder / "venv" / "bin" / "python"

    def info(self) -> dict[str, Any] | None:
        """The install's record, or None when there is none."""
        try:
            info = json.loads((self.folder / INSTALL_INFO).read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def problem(self, current: Callable[[dict[str, Any]], bool]) -> str | None:
        """Why the install cannot run the engine (NOT_INSTALLED when there is none), or None when it can;
        `current(record)`: whether this modelrunner version made it."""
        info = self.info()
        if info is None:
            return NOT_INSTALLED
        again = f"run: model reinstall-runner --backend {self.name}"
        if not self.python.exists():
            return f"its environment is gone from the cache; {again}"
        if not current(info):
            return f"installed by another modelrunner version; {again}"
        return None

    def place(
        self, env: Path, info: Mapping[str, Any], fill: Callable[[Path], object] = lambda _: None
    ) -> None:
        """Install: the link to `env`, what `fill(folder)` adds, then `info` as the record."""
        with self.locked(), staged_folder(self.folder) as staging:
            (staging / "venv").symlink_to(env, target_is_directory=True)
            fill(staging)
            (staging / INSTALL_INFO).write_text(json.dumps(info) + "\n")
