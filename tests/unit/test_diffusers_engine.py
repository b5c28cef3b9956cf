"""The diffusers engine without pip: flavours, placing a cached environment, status, command line, memory.

A stand-in cached environment (a folder with the completion file and a `bin/python`) replaces the real one,
which tests/integration/test_diffusers_inference.py installs and runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelrunner.engines import diffusers
from modelrunner.engines.base import InstallState, Mode, ModelForEngine, RunnerSettings
from modelrunner.engines.diffusers import DiffusersEngine
from modelrunner.engines.gpu import Accelerator
from modelrunner.errors import BadRequest, EngineNotInstalled, EngineUnsupported

SOCKET = Path("/run/test/runner-1.sock")
MODEL_ID = "sha256:" + "c" * 64


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "modelrunner" / "diffusers"


def fake_cached_env(flavour: str = "cpu") -> Path:
    env = diffusers.cache_root() / diffusers.env_key(flavour)
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!/bin/sh\n")
    (env / diffusers.ENV_INFO).write_text("{}")
    return env


def image_model(tmp_path: Path, fmt: str = "dduf") -> ModelForEngine:
    bundle = tmp_path / "bundle"
    (bundle / "model").mkdir(parents=True, exist_ok=True)
    (bundle / "model" / "pipe.dduf").write_bytes(b"x" * 1000)
    return ModelForEngine(MODEL_ID, "ai/sd:latest", bundle, fmt, None, 1000)


def installed(tmp_path: Path, cache: Path) -> DiffusersEngine:
    fake_cached_env()
    engine = DiffusersEngine(install_root=tmp_path / "home" / "engines" / "diffusers")
    lines: list[str] = []
    engine.install(lines.append, gpu="none")
    assert lines == [
        f"Using the cached diffusers environment ({diffusers.env_key('cpu')})",
        f"Installed diffusers {diffusers.VERSION} (cpu)",
    ]
    return engine


def test_flavours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diffusers, "detect_accelerator", lambda: Accelerator("none", "CPU"))
    assert diffusers.resolve_flavour("auto") == "cpu"
    assert diffusers.resolve_flavour("none") == "cpu"
    with pytest.raises(EngineUnsupported, match="needs an NVIDIA GPU"):
        diffusers.resolve_flavour("cuda")
    with pytest.raises(EngineUnsupported, match="no Vulkan build"):
        diffusers.resolve_flavour("vulkan")
    with pytest.raises(BadRequest, match="unknown --gpu"):
        diffusers.resolve_flavour("metal")
    monkeypatch.setattr(diffusers, "detect_accelerator", lambda: Accelerator("cuda", "NVIDIA H200"))
    assert diffusers.resolve_flavour("auto") == "cuda"
    assert diffusers.resolve_flavour("none") == "cpu"
    assert diffusers.env_key("cuda") != diffusers.env_key("cpu")


def test_not_installed_status_and_412(tmp_path: Path, cache: Path) -> None:
    engine = DiffusersEngine(install_root=tmp_path / "engines")
    assert engine.status().describe("diffusers") == "Not Installed: no diffusers environment installed"
    with pytest.raises(EngineNotInstalled, match="install-runner --backend diffusers") as info:
        engine.launch_spec(image_model(tmp_path), Mode.IMAGE_GENERATION, RunnerSettings(), SOCKET)
    assert info.value.status_code == 412


def test_install_links_the_cached_environment_and_copies_only_the_server(tmp_path: Path, cache: Path) -> None:
    engine = installed(tmp_path, cache)
    assert engine.status().describe("diffusers") == f"Running: diffusers {diffusers.VERSION}"
    folder = engine.install_dir
    assert (folder / "venv").resolve() == (cache / diffusers.env_key("cpu")).resolve()
    server = folder / "server" / "modelrunner"
    assert (server / "__init__.py").read_text() == ""  # a stub: nothing else of modelrunner is importable
    assert sorted(p.name for p in server.iterdir()) == ["__init__.py", "engines"]
    assert (server / "engines" / "diffusers_server" / "__main__.py").is_file()
    assert json.loads((folder / "install.json").read_text())["flavour"] == "cpu"
    assert 0 < engine.disk_usage() < 1_000_000  # the environment stays in the cache, counted there

    again: list[str] = []
    engine.install(again.append, gpu="none")
    assert again == [f"diffusers {diffusers.VERSION} is already installed"]
    forced: list[str] = []
    engine.install(forced.append, gpu="none", force=True)
    assert forced[0].startswith("Using the cached diffusers environment")

    engine.uninstall()
    assert not engine.install_root.exists()
    assert (cache / diffusers.env_key("cpu") / diffusers.ENV_INFO).is_file()  # other homes still use it
    assert engine.status().state is InstallState.NOT_INSTALLED


def test_status_notices_a_stale_server_or_a_vanished_environment(tmp_path: Path, cache: Path) -> None:
    engine = installed(tmp_path, cache)
    info = engine.install_dir / "install.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "server": "0" * 16}))
    status = engine.status()
    assert status.state is InstallState.ERROR and "reinstall-runner" in status.detail
    engine.install(lambda _: None, gpu="none")  # not "already installed": it repairs
    assert engine.status().state is InstallState.RUNNING

    import shutil

    shutil.rmtree(cache / diffusers.env_key("cpu"))
    status = engine.status()
    assert status.state is InstallState.ERROR and "gone from the cache" in status.detail
    assert str(tmp_path) not in status.detail


def test_install_version_must_be_the_pinned_one(tmp_path: Path) -> None:
    engine = DiffusersEngine(install_root=tmp_path / "engines")
    for ok in (None, "", "latest", diffusers.VERSION):
        engine.prepare_install("none", ok)
    with pytest.raises(BadRequest, match=diffusers.VERSION):
        engine.prepare_install("none", "0.30.0")


def test_launch_spec(tmp_path: Path, cache: Path) -> None:
    engine = installed(tmp_path, cache)
    model = image_model(tmp_path)
    spec = engine.launch_spec(model, Mode.IMAGE_GENERATION, RunnerSettings(), SOCKET)
    assert spec.argv == [
        str(engine.install_dir / "venv" / "bin" / "python"),
        "-m",
        "modelrunner.engines.diffusers_server",
        "--model-path",
        str(model.bundle / "model" / "pipe.dduf"),
        "--uds",
        str(SOCKET),
        "--served-model-name",
        "ai/sd:latest",
        MODEL_ID,
    ]
    assert spec.socket == SOCKET and spec.health_path == "/health"
    assert spec.env["PYTHONPATH"] == str(engine.install_dir / "server")
    assert spec.env["HF_HUB_OFFLINE"] == "1"


def test_launch_spec_refusals(tmp_path: Path, cache: Path) -> None:
    engine = installed(tmp_path, cache)
    model = image_model(tmp_path)
    with pytest.raises(BadRequest, match="image model: use /v1/images/generations"):
        engine.launch_spec(model, Mode.COMPLETION, RunnerSettings(), SOCKET)
    with pytest.raises(BadRequest, match="needs a DDUF model"):
        engine.launch_spec(image_model(tmp_path, "gguf"), Mode.IMAGE_GENERATION, RunnerSettings(), SOCKET)
    with pytest.raises(BadRequest, match="no runtime flags"):
        engine.launch_spec(model, Mode.IMAGE_GENERATION, RunnerSettings(runtime_flags=("--x",)), SOCKET)
    (model.bundle / "model" / "pipe.dduf").unlink()
    with pytest.raises(Exception, match="no DDUF file"):
        engine.launch_spec(model, Mode.IMAGE_GENERATION, RunnerSettings(), SOCKET)


def test_memory_estimate_grows_with_the_dduf(tmp_path: Path) -> None:
    engine = DiffusersEngine(install_root=tmp_path / "engines")
    small = image_model(tmp_path)
    big = ModelForEngine(small.id, small.reference, small.bundle, "dduf", None, 2 * 10**9)
    assert engine.estimate_memory(small, RunnerSettings()) == diffusers.MEMORY_OVERHEAD + 2000
    assert engine.estimate_memory(big, RunnerSettings()) == diffusers.MEMORY_OVERHEAD + 4 * 10**9
