"""The MLX engine for real: a `model serve` process, `mlx_lm.server` from the installer's cached environment
(MLX's CPU build on Linux), and a tiny random Llama in MLX's format made here.

Which model is MLX's: DMR's config of a safetensors model keeps the first file's `__metadata__` under
`safetensors` (pkg/distribution/format/safetensors.go extractMetadata), and MLX writes `format: mlx` there
(mlx_lm utils.py save_model). DMR picks no engine by it (pkg/inference/scheduling/scheduler.go
selectBackendForModel: vLLM for every safetensors model where vLLM runs, MLX only on macOS arm64); here the
MLX model goes to the mlx engine, the same Llama saved by transformers' layout stays with vLLM.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.engines import mlx
from tests.daemon import Daemon, engine_log, error_message, free_port
from tests.models import N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, write_tiny_safetensors_dir

LOAD = 120.0  # seconds a request may wait for the engine's start on a busy 2-core machine
CHAT = "/engines/mlx/v1/chat/completions"


@pytest.fixture(scope="module")
def mlx_env() -> Path:
    """The cached MLX environment, made through the engine's installer when missing (~1.5 min once;
    scripts/test-setup makes it before the tests)."""
    reason = mlx.unsupported_reason()
    if reason:
        pytest.fail(f"MLX cannot run on this machine ({reason}); the MLX tests need one that can")
    return mlx.ensure_env(lambda line: print(line, flush=True))


@pytest.fixture(scope="module")
def models(mlx_env: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the tiny Llama as transformers lays it out, the same converted by mlx_lm: 4-bit, MLX's format)."""
    folder = tmp_path_factory.mktemp("tiny-mlx")
    hf = write_tiny_safetensors_dir(folder / "hf")
    converted = folder / "mlx"
    argv = [str(mlx_env / "bin" / "python"), "-m", "mlx_lm", "convert", "--hf-path", str(hf)]
    argv += ["--mlx-path", str(converted), "-q", "--q-group-size", "32"]  # the tiny rows are 64 wide
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return hf, converted


@pytest.fixture(scope="module")
def daemon(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    hf, converted = models
    running = Daemon(tmp_path_factory.mktemp("mlx") / "home", free_port()).start()
    try:
        out = running.cli("install-runner", "--backend", "mlx", "--gpu", "none").stdout
        assert "Using the cached MLX environment" in out, out
        assert f"(Running: mlx {mlx.VERSION})" in out
        running.cli("package", "--safetensors-dir", str(converted), "tiny-mlx")
        running.cli("package", "--safetensors-dir", str(hf), "tiny-hf")
        yield running
    finally:
        running.stop()


def chat(daemon: Daemon, path: str = CHAT, **body: Any) -> httpx.Response:
    payload = {"model": "tiny-mlx", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}
    return daemon.http("POST", path, json={**payload, **body}, timeout=LOAD)


def engine_runners(daemon: Daemon) -> list[dict[str, Any]]:
    return list(daemon.http("GET", "/engines/ps").json())


def test_the_model_mlx_wrote_is_marked_so_in_its_config(daemon: Daemon) -> None:
    configs = {m["tags"][0]: m["config"] for m in daemon.models()}
    mlx_config, hf_config = configs["docker.io/ai/tiny-mlx:latest"], configs["docker.io/ai/tiny-hf:latest"]
    assert mlx_config["format"] == hf_config["format"] == "safetensors"
    assert mlx_config["safetensors"]["format"] == "mlx"  # the weights' __metadata__, kept as DMR keeps it
    assert hf_config["safetensors"]["format"] == "pt"


def test_chat_not_streamed_runs_in_mlx_lm_server_on_the_runner_socket(daemon: Daemon) -> None:
    response = chat(daemon)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "tiny-mlx"  # the name asked for: mlx_lm serves its one model by any name
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] >= 1
    [runner] = engine_runners(daemon)
    assert runner["backend_name"] == "mlx"
    argv = Path(f"/proc/{runner['pid']}/cmdline").read_bytes().decode().split("\0")[:-1]
    install = daemon.home / "engines" / "mlx" / mlx.VERSION
    assert argv[:2] == [str(install / "venv" / "bin" / "python"), str(install / mlx.LAUNCHER_FILE)]
    assert argv[2].endswith(".sock") and argv[3] == "--model"  # the launcher's socket, then mlx_lm's flags
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in engine_log(daemon.home, "mlx")


def test_the_format_decides_the_engine_whatever_the_url_says(daemon: Daemon) -> None:
    for path in ("/v1/chat/completions", "/engines/v1/chat/completions", "/engines/vllm/v1/chat/completions"):
        response = chat(daemon, path=path, max_tokens=2)
        assert response.status_code == 200, (path, response.text)
    assert [r["backend_name"] for r in engine_runners(daemon)] == ["mlx"]
    # The same Llama in transformers' layout is vLLM's, even at mlx's URL: not installed in this home.
    plain = chat(daemon, model="tiny-hf")
    assert plain.status_code == 412
    assert "vllm is not installed" in error_message(plain)


def test_chat_streamed(daemon: Daemon) -> None:
    body = {"model": "tiny-mlx", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    with httpx.stream("POST", daemon.url + CHAT, json={**body, "stream": True}, timeout=LOAD) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    assert len(chunks) >= 2  # the tokens came as they were made, then the finish


def test_the_memory_estimate_is_weights_plus_kv_plus_the_process(
    daemon: Daemon, models: tuple[Path, Path]
) -> None:
    assert chat(daemon, max_tokens=1).status_code == 200
    [runner] = engine_runners(daemon)
    weights = (models[1] / "model.safetensors").stat().st_size  # 4-bit: loaded as stored
    # K and V, fp32 (the tiny model's dtype), 2 layers x 2 KV heads x 16 wide, for its 512 positions
    kv = 2 * N_LAYER * N_HEAD_KV * (N_EMBD // N_HEAD) * 4 * 512
    estimate = runner["memory_estimate"]
    assert estimate == weights + kv + mlx.MEMORY_OVERHEAD
    rss_kib = next(
        int(line.split()[1])
        for line in Path(f"/proc/{runner['pid']}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    assert rss_kib * 1024 < estimate  # what the loaded server holds fits in what was reserved
    answer = daemon.http("GET", "/engines/estimate", params={"model": "tiny-mlx"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["backend"] == "mlx" and answer.json()["memory_bytes"] == estimate


def test_unload_then_a_request_reloads(daemon: Daemon) -> None:
    assert chat(daemon, max_tokens=1).status_code == 200
    [first] = engine_runners(daemon)
    unloaded = daemon.http("POST", "/engines/unload", json={"models": ["tiny-mlx"]}, timeout=LOAD).json()
    assert unloaded == {"unloaded_runners": 1}
    assert engine_runners(daemon) == []
    assert not Path(f"/proc/{first['pid']}").exists()
    assert chat(daemon, max_tokens=1).status_code == 200
    [again] = engine_runners(daemon)
    assert again["backend_name"] == "mlx" and again["pid"] != first["pid"]


def test_a_model_mlx_lm_cannot_load_fails_its_request_and_says_why(
    daemon: Daemon, models: tuple[Path, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(models[1], broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "num_hidden_layers": N_LAYER + 1}))
    daemon.cli("package", "--safetensors-dir", str(broken), "broken-mlx")
    started = time.monotonic()
    response = chat(daemon, model="broken-mlx")
    # mlx_lm's health check stays 503 after its loader died; the launcher ends the process instead, so the
    # request is answered at once with the engine's own words, not after the start timeout
    assert time.monotonic() - started < 60
    assert response.status_code == 500, response.text
    assert "engine exited with code 1" in error_message(response)
    assert "Missing 9 parameters" in error_message(response)
    assert "mlx_lm.server could not load the model" in engine_log(daemon.home, "mlx")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_stops_the_generation(daemon: Daemon, stream: bool) -> None:
    """mlx_lm stops a generation when writing its stream fails, and writes an unstreamed answer only at the
    end: the daemon asks for a stream and assembles it (Engine.assembles_unstreamed), so a client that
    leaves stops the engine's work either way. 6000 tokens take ~20 s here; the engine is idle within 5 s."""
    assert chat(daemon, max_tokens=1).status_code == 200
    [runner] = engine_runners(daemon)
    messages = [{"role": "user", "content": "hello"}]
    body = json.dumps(
        {"model": "tiny-mlx", "messages": messages, "max_tokens": 6000, "stream": stream}
    ).encode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=LOAD) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        busy = cpu_seconds(runner["pid"])
        time.sleep(1.5)
        assert cpu_seconds(runner["pid"]) - busy > 0.2, "the engine was not generating"
        assert not select.select([sock], [], [], 0)[0] or stream  # unstreamed: nothing before the end
    deadline = time.monotonic() + 5
    while True:
        before = cpu_seconds(runner["pid"])
        time.sleep(0.5)
        if cpu_seconds(runner["pid"]) - before < 0.05:
            break  # idle: the generation stopped
        assert time.monotonic() < deadline, "the engine went on generating for a client that left"
    assert not any(r["in_use"] for r in engine_runners(daemon))


def test_runtime_flags_are_refused(daemon: Daemon) -> None:
    bad = daemon.cli("configure", "tiny-mlx", "--", "--temp", "0.5", check=False)
    assert bad.returncode != 0 and "the mlx engine takes no runtime flags" in bad.stderr


def test_install_status_reinstall_uninstall(tmp_path: Path, mlx_env: Path) -> None:
    home = Daemon(tmp_path / "home", free_port()).start()
    try:
        status = home.http("GET", "/engines/status").json()
        assert status["mlx"] == "Not Installed: no MLX environment installed"
        bad = home.cli("install-runner", "--backend", "mlx", "--gpu", "cuda", check=False)
        assert bad.returncode != 0 and "installs MLX's CPU build: use --gpu none" in bad.stderr
        out = home.cli("install-runner", "--backend", "mlx").stdout
        assert f"Installed mlx {mlx.VERSION} (mlx-lm {mlx.MLX_LM_VERSION})" in out
        assert (home.home / "engines" / "mlx" / mlx.VERSION / "venv").resolve() == mlx_env.resolve()
        assert "already installed" in home.cli("install-runner", "--backend", "mlx").stdout
        assert "Using the cached MLX environment" in home.cli("reinstall-runner", "--backend", "mlx").stdout
        assert home.http("GET", "/engines/status").json()["mlx"] == f"Running: mlx {mlx.VERSION}"
        # a launcher that is not this version's (an install by another modelrunner) is not used
        launcher = home.home / "engines" / "mlx" / mlx.VERSION / mlx.LAUNCHER_FILE
        launcher.write_text(launcher.read_text() + "# older\n")
        older = "installed by another modelrunner version; run: model reinstall-runner --backend mlx"
        assert home.http("GET", "/engines/status").json()["mlx"] == f"Error: {older}"
        assert "Installed mlx" in home.cli("reinstall-runner", "--backend", "mlx").stdout
        assert launcher.read_text() == mlx.LAUNCHER
        assert home.cli("uninstall-runner", "--backend", "mlx").stdout.strip() == "Uninstalled mlx"
        assert not (home.home / "engines" / "mlx").exists()
        assert (mlx_env / "bin" / "python").exists()  # the machine's cached environment stays
    finally:
        home.stop()


def test_without_the_engine_an_mlx_model_is_412(tmp_path: Path, models: tuple[Path, Path]) -> None:
    bare = Daemon(tmp_path / "home", free_port()).start()
    try:
        bare.cli("package", "--safetensors-dir", str(models[1]), "tiny-mlx")
        response = chat(bare, path="/v1/chat/completions")
        assert response.status_code == 412
        assert "model install-runner --backend mlx" in error_message(response)
    finally:
        bare.stop()
