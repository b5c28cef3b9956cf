"""What every engine's installer shares: the machine-wide cache of builds and environments (an entry is
looked for, else made under its lock), and the bookkeeping that lets status() say "Installing" during an
install and "install failed: ..." after a failed one."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from modelrunner.engines.base import EngineStatus, InstallState
from modelrunner.errors import ModelRunnerError

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


def remove_install(root: Path, lock_file: Path) -> None:
    """Remove a runner home's install folder, under the lock its installs take."""
    from filelock import FileLock

    if not root.exists():
        return
    with FileLock(str(lock_file)):
        shutil.rmtree(root)


def folder_size(root: Path) -> int:
    """Bytes of the files under root; links (e.g. to a shared cached environment) are not followed."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total
