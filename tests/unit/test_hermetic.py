"""The suite's own guard (tests/conftest.py): tests run against a runner home, data folders and a port of
their own, and one that touches the user's real runner home or port 12434 fails."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from modelrunner import config
from modelrunner.engines.diffusers import DiffusersEngine
from modelrunner.engines.registry import default_registry
from tests.conftest import DEFAULT_PORT, Guard


def test_the_runner_home_and_port_are_the_sessions_own() -> None:
    from platformdirs import user_data_dir

    assert "modelrunner-tests-" in str(config.runner_home())
    assert "modelrunner-tests-" in user_data_dir("modelrunner", appauthor=False)
    assert config.daemon_port() != DEFAULT_PORT
    engines = {engine.name: engine for engine in default_registry()}
    diffusers = engines["diffusers"]
    assert isinstance(diffusers, DiffusersEngine)
    assert "modelrunner-tests-" in str(diffusers.install_root)


def test_the_guard_refuses_the_real_home_and_the_default_port(tmp_path: Path) -> None:
    guard = Guard(str(tmp_path / "real-home"))
    with pytest.raises(PermissionError):
        guard("open", (str(tmp_path / "real-home" / "models" / "models.json"), "r", 0))
    with pytest.raises(PermissionError):
        guard("os.scandir", (tmp_path / "real-home",))
    with pytest.raises(PermissionError):
        guard("socket.connect", (socket.socket(), ("127.0.0.1", DEFAULT_PORT)))
    guard("open", (str(tmp_path / "real-home-not" / "x"), "r", 0))  # a sibling is fine
    guard("socket.connect", (None, ("127.0.0.1", DEFAULT_PORT + 1)))
    guard("open", (3, "r", 0))  # a file descriptor
    assert len(guard.violations) == 3


def test_connecting_to_the_default_port_fails_the_test_at_once() -> None:
    with socket.socket() as sock, pytest.raises(PermissionError, match="default port"):
        sock.connect(("127.0.0.1", DEFAULT_PORT))
    from tests import conftest

    conftest._guard.violations.pop()  # this test provoked it on purpose


def test_the_real_home_is_not_opened(tmp_path: Path) -> None:
    from tests import conftest

    real = Path(conftest._guard.real_home)
    with pytest.raises(PermissionError, match="real runner home"):
        os.listdir(real)
    conftest._guard.violations.pop()
