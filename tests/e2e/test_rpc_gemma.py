"""llama.cpp across machines, on loopback: two `model worker` processes (llama.cpp's ggml-rpc-server) hold the
layers of the real Gemma 3 270M, loaded by a daemon whose llama-server runs with `--rpc`.

Greedy answers through the workers equal the local-only answers when the local run uses the same CPU kernels:
a worker keeps weights as they come (no repacking), so the baseline runs with `--no-repack` (with repacking,
llama.cpp's faster CPU kernels round differently and greedy answers part after a few tokens).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.engines import rpc_workers
from tests.daemon import Daemon, error_message, free_port
from tests.waiting import wait_until

PROMPT = "The capital of France is"
GREEDY = {"model": "gemma3:270m", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
results: dict[str, Any] = {}


class Worker:
    """One `model worker` on a free loopback port (ggml-rpc-server runs as its child)."""

    def __init__(self, env: dict[str, str], log: Path, mem_mib: int | None = None) -> None:
        self.port = free_port()
        self.env = env
        self.log = log
        self.mem_mib = mem_mib
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Worker:
        argv = [sys.executable, "-m", "modelrunner", "worker", "--port", str(self.port)]
        if self.mem_mib is not None:
            argv += ["--mem", str(self.mem_mib)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        if not rpc_workers.wait_until_listening(rpc_workers.parse_endpoint(self.endpoint), 30):
            raise RuntimeError("the worker did not listen:\n" + self.log.read_text())
        return self

    def child(self) -> int:
        """ggml-rpc-server's pid: `model worker` runs it as its child."""
        assert self.process is not None
        pid = self.process.pid
        [worker] = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return int(worker)

    def rss(self) -> int:
        return rss(self.child())

    def kill(self) -> None:
        """A `kill -9` of the command: its worker ends with it (and frees its port) before this returns."""
        if self.process is not None and self.process.poll() is None:
            worker = self.child()
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
            wait_until(lambda: not Path(f"/proc/{worker}").exists(), "the worker to end", timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def env(llama_server: Path) -> dict[str, str]:
    return {**os.environ, "LLAMA_SERVER_PATH": str(llama_server)}


@pytest.fixture(scope="module")
def workers(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Worker]]:
    folder = tmp_path_factory.mktemp("rpc-workers")
    started = [Worker(env, folder / f"worker-{i}.log").start() for i in range(2)]
    try:
        yield started
    finally:
        for worker in started:
            worker.stop()


@pytest.fixture(scope="module")
def daemon(
    env: dict[str, str], gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    running = Daemon(tmp_path_factory.mktemp("rpc") / "home", free_port())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLAMA_SERVER_PATH", env["LLAMA_SERVER_PATH"])  # read by Daemon.env
        try:
            running.start()
            running.cli("package", "--gguf", str(gemma_gguf), "--context-size", "2048", "gemma3:270m")
            yield running
        finally:
            running.stop()


def greedy(daemon: Daemon) -> str:
    response = daemon.http("POST", "/v1/completions", json=GREEDY, timeout=300)
    assert response.status_code == 200, response.text
    text: str = response.json()["choices"][0]["text"]
    assert text.strip()
    return text


def runner(daemon: Daemon) -> dict[str, Any]:
    [only] = daemon.http("GET", "/engines/ps").json()
    return dict(only)


def configure(daemon: Daemon, *args: str) -> None:
    """`args` and what every test runs with (never unloaded; no repacking: the kernels the workers use),
    in one configure: each is the model's whole configuration, as in DMR."""
    daemon.cli("configure", "gemma3:270m", "--keep-alive", "-1", *args, "--", "--no-repack")


def rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_local_only_answer(daemon: Daemon) -> None:
    configure(daemon)
    results["local"] = greedy(daemon)
    local = runner(daemon)
    assert "layout" not in local
    results["local_estimate"] = local["memory_estimate"]
    results["local_rss"] = rss(local["pid"])


def test_two_workers_give_the_same_greedy_answer(daemon: Daemon, workers: list[Worker]) -> None:
    idle = [worker.rss() for worker in workers]
    spread = ",".join(worker.endpoint for worker in workers)
    configure(daemon, "--rpc", spread)
    assert greedy(daemon) == results["local"]
    loaded = runner(daemon)
    argv = Path(f"/proc/{loaded['pid']}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--rpc") + 1] == spread and "--no-repack" in argv
    assert loaded["layout"] == {"rpc_workers": [worker.endpoint for worker in workers]}
    # every layer went to the workers: each holds about half of the blocks (~34 MB of Gemma's 68 MB) ...
    for before, worker in zip(idle, workers, strict=True):
        assert worker.rss() - before > 20 * 2**20
    # ... and only the token embeddings and buffers stay here, which is all the estimate counts
    assert loaded["memory_estimate"] < results["local_estimate"]
    assert 0.5 < loaded["memory_estimate"] / rss(loaded["pid"]) < 2.0
    assert rss(loaded["pid"]) < results["local_rss"]
    shown = daemon.cli("ps").stdout
    assert "LAYOUT" in shown and f"rpc {spread}" in shown
    configured = json.loads(daemon.cli("configure", "show", "gemma3:270m").stdout)
    assert configured[0]["Config"]["llamacpp"]["rpc"] == ",".join(worker.endpoint for worker in workers)


def test_a_worker_lost_mid_stream_ends_the_stream_with_an_error_then_the_model_reloads(
    daemon: Daemon, workers: list[Worker]
) -> None:
    body = {**GREEDY, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", daemon.url + "/v1/completions", json=body, timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 5:
                workers[1].kill()
    assert len(events) > 5 and "[DONE]" not in events
    last = json.loads(events[-1])["error"]  # OpenAI's stream error event, which the SDKs raise
    assert last["type"] == "server_error" and "engine stopped" in last["message"]
    # the next load finds the worker gone and says which (a 503), instead of an engine that dies
    deadline = time.monotonic() + 60
    while True:
        response = daemon.http("POST", "/v1/completions", json=GREEDY, timeout=300)
        if response.status_code != 500 or time.monotonic() > deadline:  # 500: the dying engine, not yet seen
            break
        time.sleep(0.5)
    assert response.status_code == 503, response.text
    assert workers[1].endpoint in error_message(response)
    assert daemon.http("GET", "/engines/ps").json() == []
    # the worker is back (same port): the next request loads the model again, with the same answer
    workers[1].start()
    assert greedy(daemon) == results["local"]
    assert runner(daemon)["layout"]["rpc_workers"][1] == workers[1].endpoint


def test_a_worker_that_does_not_answer_at_load_is_a_503_naming_it(
    daemon: Daemon, workers: list[Worker]
) -> None:
    absent = f"127.0.0.1:{free_port()}"
    configure(daemon, "--rpc", f"{workers[0].endpoint},{absent}")
    response = daemon.http("POST", "/v1/completions", json=GREEDY)
    assert response.status_code == 503
    message = error_message(response)
    assert absent in message and "model worker" in message
    assert daemon.http("GET", "/engines/ps").json() == []  # nothing half-loaded
    # a configuration without workers brings the local-only model back
    configure(daemon)
    assert greedy(daemon) == results["local"]
    assert "layout" not in runner(daemon)


def test_a_worker_capped_below_the_model_fails_the_load_and_survives(
    daemon: Daemon, env: dict[str, str], tmp_path: Path
) -> None:
    capped = Worker(env, tmp_path / "capped.log", mem_mib=16).start()
    try:
        configure(daemon, "--rpc", capped.endpoint)
        response = daemon.http("POST", "/v1/completions", json=GREEDY, timeout=300)
        assert response.status_code == 500
        assert "RPC" in error_message(response)
        assert capped.process is not None and capped.process.poll() is None  # the worker lives on
        assert "Failed to allocate" in capped.log.read_text()
    finally:
        capped.stop()
        configure(daemon, "--rpc", "")  # "" turns the workers off too


def test_bad_rpc_settings_are_refused_and_change_nothing(daemon: Daemon) -> None:
    deadline = time.monotonic() + 120  # configure's preload of the previous test may still run
    while any(r["in_use"] or r["loading"] for r in daemon.http("GET", "/engines/ps").json()):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    before = daemon.cli("configure", "show", "gemma3:270m").stdout
    for value in ("nohost", "127.0.0.1:0", "[::1]:50052"):
        body = {"model": "gemma3:270m", "llamacpp": {"rpc": value}}
        response = daemon.http("POST", "/engines/_configure", json=body)
        assert response.status_code == 400, response.text
        assert error_message(response)
    assert daemon.cli("configure", "show", "gemma3:270m").stdout == before
