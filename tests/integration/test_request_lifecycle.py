"""The request lifecycle with the real engine (llama-server, tiny GGUFs): unstreamed answers assembled from
the engine's stream are the answers the engine gives unstreamed; embeddings up to the context; a runner
left by a client is free for the next request; SIGTERM ends streams properly; resources stay bounded."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon import Daemon, Daemons
from tests.models import write_tiny_gguf

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def start(daemons: Daemons, llama_server: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))

    def starter(**env: str) -> Daemon:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return daemons.start()

    return starter


def engine_socket(daemon: Daemon, mode: str = "completion") -> str:
    [runner] = [r for r in daemon.http("GET", "/engines/ps").json() if r["mode"] == mode]
    argv = Path(f"/proc/{runner['pid']}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index("--host") + 1]


def without_run_details(doc: dict[str, Any]) -> dict[str, Any]:
    """An answer without what differs from one run to the next: ids, times, timing values, and how the
    prompt's tokens split between cache and evaluation (llama-server's Messages API always caches)."""
    out = {k: v for k, v in doc.items() if k not in ("id", "created")}
    if "timings" in out:
        out["timings"] = sorted(out["timings"])
    usage = dict(out.get("usage") or {})
    if "cache_read_input_tokens" in usage:
        usage["input_tokens"] += usage.pop("cache_read_input_tokens")
        out["usage"] = usage
    return out


@pytest.mark.parametrize(
    ("route", "engine_path", "body"),
    [
        ("/engines/v1/chat/completions", "/v1/chat/completions", {"messages": HI, "max_tokens": 12}),
        (
            "/v1/chat/completions",
            "/v1/chat/completions",
            {"messages": HI, "max_tokens": 12, "logprobs": True, "top_logprobs": 2},
        ),
        ("/v1/completions", "/v1/completions", {"prompt": "hello world", "max_tokens": 12, "logprobs": 2}),
        ("/v1/chat/completions", "/v1/chat/completions", {"messages": HI, "max_tokens": 30, "stop": ["a"]}),
        ("/anthropic/v1/messages", "/v1/messages", {"messages": HI, "max_tokens": 12}),
    ],
)
def test_an_assembled_answer_is_the_engines_own(
    start: Any, tmp_path: Path, route: str, engine_path: str, body: dict[str, Any]
) -> None:
    """Greedy sampling, no prompt cache: the engine answers the same request alike twice. Through the
    daemon it is asked for as a stream and assembled; on its own socket it answers unstreamed."""
    daemon = start()
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)), "tiny")
    request = {**body, "model": "tiny", "temperature": 0, "cache_prompt": False}
    through = daemon.http("POST", route, json=request)
    assert through.status_code == 200, through.text
    with httpx.Client(transport=httpx.HTTPTransport(uds=engine_socket(daemon)), timeout=60) as engine:
        direct = engine.post("http://engine" + engine_path, json=request)
    assert direct.status_code == 200 and "text/event-stream" not in direct.headers["content-type"]
    assert without_run_details(through.json()) == without_run_details(direct.json())
    assert through.json()["id"] and (engine_path == "/v1/messages" or through.json()["created"])


def test_embeddings_up_to_the_context_and_a_400_beyond(start: Any, tmp_path: Path) -> None:
    """Inputs longer than llama-server's default physical batch (512) are embedded; beyond the context,
    each API answers a 400 in its own shape (not a 500 that clients retry), Ollama's when told not to
    truncate."""
    daemon = start()
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", context_length=2048)
    daemon.cli("package", "--gguf", str(gguf), "tiny")
    long = "hello world " * 60  # ~720 tokens with the tiny vocabulary: beyond 512, within 2048
    answer = daemon.http("POST", "/v1/embeddings", json={"model": "tiny", "input": long})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"][0]["embedding"]) == 64
    too_long = "hello world " * 400  # ~4800 tokens
    refused = daemon.http("POST", "/v1/embeddings", json={"model": "tiny", "input": too_long})
    assert refused.status_code == 400, refused.text
    assert "longer than the model's context" in refused.json()["error"]["message"]
    # Ollama's `truncate` is true unless said otherwise (test_ollama_api.py tests the truncation)
    ollama = daemon.http("POST", "/api/embed", json={"model": "tiny", "input": too_long, "truncate": False})
    assert ollama.status_code == 400 and "context" in ollama.json()["error"]
    assert daemon.http("POST", "/api/embed", json={"model": "tiny", "input": long}).status_code == 200


def test_a_runner_left_by_its_client_serves_the_next_request(start: Any, tmp_path: Path) -> None:
    """With one runner allowed, an Anthropic stream its client left must not hold it: a request that needs
    another runner (embeddings) is served."""
    daemon = start(MODEL_RUNNER_MAX_RUNNERS="1")
    daemon.cli(
        "package", "--gguf", str(write_tiny_gguf(tmp_path / "long.gguf", context_length=32768)), "long"
    )
    body = {"model": "long", "messages": HI, "max_tokens": 20000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", daemon.url + "/anthropic/v1/messages", json=body, timeout=60) as response:
        assert next(line for line in response.iter_lines() if line.startswith("data: "))
    answer = daemon.http("POST", "/v1/embeddings", json={"model": "long", "input": "hi"}, timeout=120)
    assert answer.status_code == 200, answer.text
    assert [r["mode"] for r in daemon.http("GET", "/engines/ps").json()] == ["embedding"]


def test_sigterm_ends_streams_in_progress_with_an_error_in_their_apis_shape(
    start: Any, tmp_path: Path
) -> None:
    """Streams still running when the grace period ends get an error event and a proper end (the last
    chunk), on the front and the ASGI paths; then the daemon and its engines stop."""
    daemon = start(MODEL_RUNNER_SHUTDOWN_GRACE="1")
    # streams that cannot end by themselves before the signal on a slow machine: the tiny model writes
    # thousands of tokens a second, and llama-server divides the context among its slots (2**20 / 5 a slot:
    # its KV cache is 256 bytes a token)
    context, tokens = 2**20, 200_000
    daemon.cli(
        "package", "--gguf", str(write_tiny_gguf(tmp_path / "long.gguf", context_length=context)), "long"
    )
    long = {"model": "long", "max_tokens": tokens, "stream": True, "ignore_eos": True}
    requests = {
        "openai-front": ("/v1/chat/completions", {**long, "messages": HI}, {}),
        "openai-asgi": ("/v1/chat/completions", {**long, "messages": HI}, {"origin": "http://localhost"}),
        "anthropic": ("/anthropic/v1/messages", {**long, "messages": HI}, {}),
        "ollama": ("/api/chat", {"model": "long", "messages": HI, "options": {"num_predict": tokens}}, {}),
        "responses": ("/v1/responses", {"model": "long", "input": "hi", "stream": True}, {}),
    }
    # a slot for each stream, and no end of text (the Ollama and Responses bodies cannot ask for that)
    daemon.cli("configure", "long", "--", "--ignore-eos", "--parallel", str(len(requests)))
    started = {name: threading.Event() for name in requests}
    results: dict[str, list[str] | BaseException] = {}

    def read(name: str) -> None:
        path, body, headers = requests[name]
        lines = []
        try:
            with httpx.stream("POST", daemon.url + path, json=body, headers=headers, timeout=60) as response:
                assert response.status_code == 200
                for line in response.iter_lines():  # a chunked body cut short raises here
                    if line.strip():
                        lines.append(line)
                        started[name].set()
            results[name] = lines
        except BaseException as exc:
            results[name] = exc

    threads = [threading.Thread(target=read, args=(name,), daemon=True) for name in requests]
    for thread in threads:
        thread.start()
    for name, event in started.items():
        assert event.wait(60), f"{name}: the stream did not start"
    [pid] = [r["pid"] for r in daemon.http("GET", "/engines/ps").json()]
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(60)
    assert daemon.process.wait(30) == -signal.SIGTERM  # uvicorn re-raises the signal after its shutdown
    assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower()
    assert all(isinstance(value, list) for value in results.values()), results
    reason = "the model runner is shutting down"
    lines: dict[str, list[str]] = {name: value for name, value in results.items() if isinstance(value, list)}
    for name in ("openai-front", "openai-asgi"):
        last = json.loads(lines[name][-1].removeprefix("data: "))  # OpenAI's stream error, for the SDKs
        assert last == {"error": {"message": reason, "type": "server_error", "code": None, "param": None}}
    assert lines["anthropic"][-2] == "event: error"
    error = json.loads(lines["anthropic"][-1].removeprefix("data: "))
    assert error == {"type": "error", "error": {"type": "api_error", "message": reason}}
    assert json.loads(lines["ollama"][-1]) == {"error": reason}
    assert lines["responses"][-2] == "event: response.failed"
    failed = json.loads(lines["responses"][-1].removeprefix("data: "))
    assert failed["response"]["error"]["message"] == reason


def test_resources_stay_bounded_under_load(start: Any, tmp_path: Path) -> None:
    """200 streams at concurrency 16, then 100 abandoned ones: the daemon's open file descriptors and
    resident memory end where they started (within 10 %), and no runner is left in use."""
    daemon = start()
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "tiny.gguf")), "tiny")
    assert daemon.process is not None
    pid = daemon.process.pid
    body = {"model": "tiny", "messages": HI, "max_tokens": 16, "stream": True, "ignore_eos": True}

    def stream(_: int) -> bool:
        with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=120) as response:
            return [line for line in response.iter_lines() if line.startswith("data: ")][-1] == "data: [DONE]"

    def abandon(i: int) -> None:
        raw = json.dumps({**body, "max_tokens": 400}).encode()
        with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + b"Content-Length: %d\r\n\r\n" % len(raw)
                + raw
            )
            if i % 2:
                sock.recv(1024)  # some leave mid-stream, the others before the first byte

    def measure() -> tuple[int, int]:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
        return fds, rss

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(stream, range(48)))  # warm: caches, pools, imports
        time.sleep(1)
        fds_before, rss_before = measure()
        assert all(pool.map(stream, range(200)))
        list(pool.map(abandon, range(100)))
    deadline = time.monotonic() + 60
    while any(r["in_use"] for r in daemon.http("GET", "/engines/ps").json()):
        assert time.monotonic() < deadline, "a runner stayed in use"
        time.sleep(0.1)
    # idle engine connections close after EnginePool's idle limit and abandoned streams end at their next
    # write: a few seconds under load; a leak never comes back
    deadline = time.monotonic() + 15
    while (fds_after := measure()[0]) > fds_before * 1.1 and time.monotonic() < deadline:
        time.sleep(0.5)
    fds_after, rss_after = measure()
    print(f"\nfds {fds_before} -> {fds_after}, RSS {rss_before} kB -> {rss_after} kB")
    assert fds_after <= fds_before * 1.1, (fds_before, fds_after)
    assert rss_after <= rss_before * 1.1, (rss_before, rss_after)
