"""Session-wide rules of the test suite.

* Markers by folder: `-m unit`, `-m integration` and `-m e2e` select tests/unit, tests/integration and
  tests/e2e (scripts/test passes such options to pytest).
* Hermetic by default: before any test runs, the runner home (MODEL_RUNNER_HOME), the platform data and
  config folders (XDG_DATA_HOME, XDG_CONFIG_HOME), Docker's credentials folder (DOCKER_CONFIG) and the
  daemon port (MODEL_RUNNER_PORT) point at this session's own temporary places, for this process and every
  daemon or CLI it starts. Engine caches (XDG_CACHE_HOME, ~/.cache/modelrunner) stay shared on purpose.
* A guard: a test that opens, lists or changes anything under the user's real runner home
  (~/.local/share/modelrunner), or connects to or binds the default port 12434, fails.
* Shared fixtures (`pytest_plugins`): a test asks for `llama_server`, `vllm_venv`, `tiny_vllm_model`,
  `diffusers_python`, `tiny_sd_dduf`, `daemon`, `daemons`, `fake_daemon`, `fake_daemons` or `endpoint` by
  parameter name, nothing to import; the signing tests' `signing_registry`, `referrers_registry` and
  `cosign_password` likewise (tests/signing_fixtures.py, none autouse).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import free_port

pytest_plugins = [
    "tests.daemon_fixtures",
    "tests.engines",
    "tests.vllm_env",
    "tests.diffusers_env",
    "tests.signing_fixtures",
    "tests.conformance.dmr_daemons",
    "tests.conformance.openai_endpoint",
]

DEFAULT_PORT = 12434
_FOLDER_MARKERS = {"unit": "unit", "integration": "integration", "e2e": "e2e"}
_FILE_EVENTS = {
    "open",
    "os.mkdir",
    "os.listdir",
    "os.scandir",
    "os.rename",
    "os.remove",
    "os.rmdir",
    "os.chmod",
    "os.truncate",
    "os.link",
    "os.symlink",
    "os.utime",
    "shutil.rmtree",
    "shutil.copyfile",
    "shutil.move",
}
_SOCKET_EVENTS = {"socket.connect", "socket.bind"}
_LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0", "::", ""}


def _real_runner_home() -> str:
    """Where `model` keeps its data for the user running the tests (computed before pytest_configure
    points the environment elsewhere)."""
    from platformdirs import user_data_dir

    explicit = os.environ.get("MODEL_RUNNER_HOME")
    return os.path.abspath(explicit or user_data_dir("modelrunner", appauthor=False))


class Guard:
    """An audit hook (sys.addaudithook) that notices the real runner home and the default port."""

    def __init__(self, real_home: str) -> None:
        self.real_home = real_home
        self.violations: list[str] = []

    def _path(self, value: Any) -> str | None:
        if isinstance(value, (str, bytes, os.PathLike)):
            try:
                return os.path.abspath(os.fsdecode(value))
            except (TypeError, ValueError):
                return None
        return None

    def __call__(self, name: str, args: tuple[Any, ...]) -> None:
        if name in _FILE_EVENTS:
            for value in args[:2]:
                path = self._path(value)
                if path and (path == self.real_home or path.startswith(self.real_home + os.sep)):
                    self._refuse(f"{name} {path}: tests must not touch the real runner home")
        elif name in _SOCKET_EVENTS:
            address = args[1] if len(args) > 1 else None
            if (
                isinstance(address, tuple)
                and len(address) >= 2
                and address[1] == DEFAULT_PORT
                and str(address[0]) in _LOOPBACK
            ):
                self._refuse(f"{name} {address[0]}:{DEFAULT_PORT}: tests must not use the default port")

    def _refuse(self, what: str) -> None:
        self.violations.append(what)
        raise PermissionError(what)


_guard = Guard(_real_runner_home())
_session_dir = Path(tempfile.mkdtemp(prefix="modelrunner-tests-"))


def pytest_configure(config: pytest.Config) -> None:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    os.environ.update(
        {
            "XDG_CACHE_HOME": cache,  # the one shared thing: engine builds and environments
            "MODEL_RUNNER_HOME": str(_session_dir / "home"),
            "XDG_DATA_HOME": str(_session_dir / "data"),
            "XDG_CONFIG_HOME": str(_session_dir / "config"),
            "DOCKER_CONFIG": str(_session_dir / "docker"),
            "MODEL_RUNNER_PORT": str(free_port()),  # nothing listens there unless a test starts a daemon
        }
    )
    for name in ("MODELS_PATH", "MODEL_RUNNER_HOST", "MODEL_RUNNER_API_KEY"):
        os.environ.pop(name, None)
    sys.addaudithook(_guard)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_session_dir, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        try:
            folder = Path(item.path).relative_to(root).parts[0]
        except ValueError:
            continue
        marker = _FOLDER_MARKERS.get(folder)
        if marker is not None:
            item.add_marker(marker)


@pytest.fixture(autouse=True)
def _hermetic() -> Iterator[None]:
    """Fails the test (even one that caught the PermissionError) that touched the real home or port."""
    before = len(_guard.violations)
    yield
    new = _guard.violations[before:]
    if new:
        pytest.fail("not hermetic: " + "; ".join(new), pytrace=False)
