"""Daemons and CLI processes for the DMR conformance tests: the real daemon (HTTP, security middleware,
routers, scheduler, store) with the scripted fake engine as llama.cpp, so runners load in a blink; and the
`model` CLI as a separate process pointed at it, with its own DOCKER_CONFIG (never the user's)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from modelrunner.engines.base import Engine
from tests.fake_engine import FakeEngine
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf


def package(daemon: InProcessDaemon, folder: Path, name: str, seed: int = 0) -> str:
    gguf = write_tiny_gguf(folder / f"{name.replace('/', '_').replace(':', '_')}-{seed}.gguf", seed=seed)
    response = daemon.http("POST", "/models/package", json={"target": name, "gguf": str(gguf)})
    assert response.status_code == 201, response.text
    model_id: str = response.json()["id"]
    return model_id


class FakeDaemons:
    """Starts in-process daemons with the scripted engine as llama.cpp, each with its models packaged; the
    fixture `fake_daemons` (or `fake_daemons_under`, for a module's daemon) stops every one at the end."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch
        self.running: list[InProcessDaemon] = []
        # the runner home of the daemons to come, already for what the test prepares before them
        monkeypatch.setenv("MODEL_RUNNER_HOME", str(tmp_path / "home"))
        monkeypatch.delenv("MODEL_RUNNER_API_KEY", raising=False)

    def start(
        self,
        env: dict[str, str] | None = None,
        *,
        front: bool | None = True,
        models: tuple[str, ...] = ("tiny",),
        home: Path | None = None,
        engines: Mapping[str, Engine] | None = None,
        **limits: Any,
    ) -> InProcessDaemon:
        """`env`: the fake engine's FAKE_* script, or `engines` the daemon's own (an engine the test keeps
        to look into); `models` are packaged, each from its own seed; `limits` the scheduler's; `front`
        as uvicorn_config reads it (None: as MODEL_RUNNER_FAST_PATH says)."""
        home = home or self.tmp_path / "home"
        self.monkeypatch.setenv("MODEL_RUNNER_HOME", str(home))
        engines = engines if engines is not None else {"llama.cpp": FakeEngine(env=env or {})}
        daemon = InProcessDaemon(home, engines, front, **limits).start()
        self.running.append(daemon)
        for seed, name in enumerate(models):
            package(daemon, self.tmp_path, name, seed)
        return daemon

    def stop_all(self) -> None:
        for daemon in self.running:
            daemon.stop()


@pytest.fixture
def fake_daemons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDaemons]:
    daemons = FakeDaemons(tmp_path, monkeypatch)
    try:
        yield daemons
    finally:
        daemons.stop_all()


@contextlib.contextmanager
def fake_daemons_under(folder: Path) -> Iterator[FakeDaemons]:
    """The factory for a daemon that outlives one test (a module-scoped fixture): its own environment
    patch, undone with every daemon stopped at the end."""
    with pytest.MonkeyPatch.context() as patch:
        daemons = FakeDaemons(folder, patch)
        try:
            yield daemons
        finally:
            daemons.stop_all()


@pytest.fixture
def fake_daemon(fake_daemons: FakeDaemons) -> InProcessDaemon:
    """A daemon with the fake engine and one model, `tiny` (ai/tiny:latest)."""
    return fake_daemons.start({"FAKE_CHUNKS": "3"})


def cli_env(tmp_path: Path, url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a CLI process: its own runner home and Docker config, the daemon named."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MODEL_RUNNER_HOST", "MODEL_RUNNER_API_KEY", "MODELS_PATH")
        and not k.startswith("MODEL_RUNNER_TLS")
    }
    env.update({"MODEL_RUNNER_HOME": str(tmp_path / "cli-home"), "DOCKER_CONFIG": str(tmp_path / "docker")})
    if url is not None:
        env["MODEL_RUNNER_HOST"] = url
    env.update(extra)
    return env


def run_cli(
    env: dict[str, str], *args: str, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelrunner", *args],
        env=env,
        capture_output=True,
        text=True,
        input=stdin if stdin is not None else "",
        timeout=timeout,
    )
