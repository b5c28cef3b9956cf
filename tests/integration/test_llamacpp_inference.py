"""The inference path with the real engine: a `model serve` process, a real `llama-server` built from the
pinned llama.cpp, the tiny GGUF written by tests/models.py, and the official `openai` client."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import math
import os
import signal
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest

from tests.daemon import Daemon, free_port
from tests.models import write_tiny_gguf


@pytest.fixture
def daemon(tmp_path: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    running = Daemon(tmp_path / "home", free_port()).start()
    running.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "tiny.gguf")), "tiny")
    yield running
    running.stop()


def engine_pids(daemon: Daemon) -> list[int]:
    return [r["pid"] for r in daemon.http("GET", "/engines/ps").json()]


def test_chat_completion_not_streamed(daemon: Daemon) -> None:
    # ignore_eos: random weights may pick end-of-text early; the counts below must be exact
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "ignore_eos": True,
    }
    response = daemon.http("POST", "/engines/llama.cpp/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion"
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["choices"][0]["finish_reason"] == "length"


def test_chat_streamed_through_every_route_prefix(daemon: Daemon) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,  # random weights may pick end-of-text early; the count below must be exact
    }
    for path in (
        "/engines/v1/chat/completions",
        "/engines/llama.cpp/v1/chat/completions",
        "/v1/chat/completions",
    ):
        with httpx.stream("POST", daemon.url + path, json=body, timeout=60) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert len(engine_pids(daemon)) == 1  # one runner served all three prefixes


def test_speculative_decoding_with_a_draft_model(daemon: Daemon, tmp_path: Path) -> None:
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "target.gguf", seed=8)), "target")
    # the draft: the target's weights in another file (another model ID), so its drafts are accepted
    draft = write_tiny_gguf(tmp_path / "draft.gguf", seed=8, context_length=1024)
    daemon.cli("package", "--gguf", str(draft), "draft")
    draft_tag = daemon.http("GET", "/models/draft").json()["tags"][0]
    daemon.cli(
        *("configure", "target", "--speculative-draft-model", "draft"),
        # random weights give flat probabilities: any minimum above 0 would stop every draft
        *("--speculative-num-tokens", "4", "--speculative-min-acceptance-rate", "0"),
    )
    [shown] = daemon.http("GET", "/engines/_configure", params={"model": "target"}).json()
    # DMR's shape (pkg/inference/backend.go): a zero min_acceptance_rate is left out (omitempty)
    assert shown["Config"] == {"speculative": {"draft_model": draft_tag, "num_tokens": 4}}
    body = {
        "model": "target",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "ignore_eos": True,
        "temperature": 0,
    }
    answer = daemon.http("POST", "/v1/chat/completions", json=body).json()
    assert answer["usage"]["completion_tokens"] == 16
    assert answer["timings"]["draft_n"] > 0 and answer["timings"]["draft_n_accepted"] > 0
    [runner] = [r for r in daemon.http("GET", "/engines/ps").json() if r["model_name"] == "target"]
    argv = Path(f"/proc/{runner['pid']}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--model-draft") + 1].startswith(str(daemon.store_root / "bundles"))
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"

    daemon.cli("configure", "target", "--speculative-draft-model", "")  # off again
    assert daemon.http("GET", "/engines/_configure", params={"model": "target"}).json()[0]["Config"] == {}
    answer = daemon.http("POST", "/v1/chat/completions", json=body).json()
    assert answer["usage"]["completion_tokens"] == 16 and not answer["timings"].get("draft_n")


def test_completions(daemon: Daemon) -> None:
    body = {"model": "tiny", "prompt": "Once upon", "max_tokens": 4, "ignore_eos": True}
    answer = daemon.http("POST", "/v1/completions", json=body).json()
    assert answer["usage"]["completion_tokens"] == 4


def test_embeddings_run_in_their_own_embedding_mode_runner(daemon: Daemon) -> None:
    # The tiny model is generative, without a pooling type of its own: the engine adds mean pooling.
    daemon.http(
        "POST",
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    )
    answer = daemon.http("POST", "/v1/embeddings", json={"model": "tiny", "input": ["hello", "world"]}).json()
    assert [item["index"] for item in answer["data"]] == [0, 1]
    assert len(answer["data"][0]["embedding"]) == 64  # n_embd of the tiny model
    modes = sorted(r["mode"] for r in daemon.http("GET", "/engines/ps").json())
    assert modes == ["completion", "embedding"]


def decoded(embedding: list[float] | str) -> list[float]:
    """An embedding asked for as base64 explicitly: the client leaves it as OpenAI sends it."""
    if isinstance(embedding, list):
        return embedding
    raw = base64.b64decode(embedding)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def test_embeddings_dimensions_as_openai_honours_them(daemon: Daemon) -> None:
    """`dimensions` keeps a vector's first values, normalised again, as floats and as the base64 the
    official client asks for by default, on every route prefix; below 1 or beyond the model's size it is
    OpenAI's 400 (`param: dimensions`), and an invalid one loads nothing."""
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="tiny", input="hello", dimensions=0)
    assert refused.value.param == "dimensions" and "Expected a value >= 1" in refused.value.message
    assert daemon.http("GET", "/engines/ps").json() == []
    [full] = client.embeddings.create(model="tiny", input="hello", encoding_format="float").data
    assert len(full.embedding) == 64
    expected = [v / math.sqrt(sum(x * x for x in full.embedding[:8])) for v in full.embedding[:8]]
    encodings: tuple[Literal["base64", "float"] | None, ...] = ("base64", "float", None)
    for prefix in ("/v1", "/engines/v1", "/engines/llama.cpp/v1"):
        on = openai.OpenAI(base_url=daemon.url + prefix, api_key="unused")
        for encoding in encodings:  # None: the client asks base64 and decodes it
            answer = on.embeddings.create(
                model="tiny",
                input=["hello", "world"],
                dimensions=8,
                encoding_format=encoding or openai.omit,
            )
            vectors = [decoded(item.embedding) for item in answer.data]
            assert [len(v) for v in vectors] == [8, 8], (prefix, encoding)
            assert vectors[0] == pytest.approx(expected, abs=1e-6), (prefix, encoding)
            assert answer.usage.prompt_tokens > 0
    default = client.embeddings.create(model="tiny", input="hello", dimensions=64).data[0].embedding
    assert default == pytest.approx(full.embedding, abs=1e-6)  # base64 by default, decoded by the client
    with pytest.raises(openai.BadRequestError) as beyond:
        client.embeddings.create(model="tiny", input="hello", dimensions=65)
    assert beyond.value.param == "dimensions" and "Expected a value <= 64" in beyond.value.message
    assert client.embeddings.create(model="tiny", input="hello").data[0].embedding == pytest.approx(
        full.embedding
    )


def test_the_official_openai_client_streams_through_engines_v1(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused")
    listed = [m.id for m in client.models.list()]
    assert listed == ["docker.io/ai/tiny:latest"]  # DMR's ToOpenAI: the first tag as stored
    stream = client.chat.completions.create(
        model=listed[0], messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
    )
    finish = [c.choices[0].finish_reason for c in stream if c.choices]
    assert finish[-1] in ("length", "stop")  # random weights may emit end-of-text early
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="absent", messages=[{"role": "user", "content": "hi"}])


def test_killing_the_engine_mid_stream_errors_then_the_next_request_reloads(
    daemon: Daemon, tmp_path: Path
) -> None:
    # llama-server caps a slot at the model's trained context: a model trained for 32k tokens streams for
    # seconds (the 512-token tiny one is done in ~0.1 s), long enough to be killed mid-way.
    daemon.cli(
        "package", "--gguf", str(write_tiny_gguf(tmp_path / "long.gguf", context_length=32768)), "long"
    )
    daemon.cli("configure", "long", "--", "--parallel", "1")
    body = {
        "model": "long",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 30000,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        [pid] = engine_pids(daemon)
        os.kill(pid, signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    assert json.loads(rest[-1][6:])["error"]["type"] == "server_error"  # OpenAI's stream error event
    again = daemon.http("POST", "/v1/chat/completions", json={**body, "stream": False, "max_tokens": 2})
    assert again.status_code == 200
    assert engine_pids(daemon) != [pid]


def test_daemon_sigterm_stops_its_engines(daemon: Daemon) -> None:
    daemon.http(
        "POST",
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    )
    [pid] = engine_pids(daemon)
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(30) == -signal.SIGTERM  # uvicorn re-raises the signal after its shutdown
    assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower()


def test_configured_context_size_reaches_the_engine_and_survives_restart(daemon: Daemon) -> None:
    assert daemon.cli("configure", "tiny", "--context-size", "256").returncode == 0
    daemon.stop()
    daemon.start()
    daemon.http(
        "POST",
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    )
    [pid] = engine_pids(daemon)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--ctx-size") + 1] == b"256"


def test_cli_run_ps_unload(daemon: Daemon) -> None:
    # The tiny model has random weights and run samples, so its first token can be the end of the answer (an
    # empty reply, as CI once drew); a few tries make a real answer near certain without hiding a broken run.
    outs = []
    for _ in range(4):
        outs.append(daemon.cli("run", "tiny", "hello").stdout)
        if len(outs[-1]) > 1:
            break
    assert all(out.endswith("\n") for out in outs) and len(outs[-1]) > 1, outs
    ps = daemon.cli("ps").stdout.splitlines()
    assert ps[0].split()[:3] == ["MODEL", "NAME", "BACKEND"] and ps[1].split()[:3] == [
        "tiny",
        "llama.cpp",
        "completion",
    ]
    assert daemon.cli("unload", "tiny").stdout.strip() == "Unloaded 1 model(s)."
    assert daemon.cli("unload", "--all").stdout.strip() == "No models are running."


def test_a_bad_runtime_flag_is_refused(daemon: Daemon) -> None:
    result = daemon.cli("configure", "tiny", "--", "--model", "/etc/passwd", check=False)
    assert (
        result.returncode == 1 and "not allowed" in result.stderr.lower()
    ) or "path" in result.stderr.lower()


def test_sixteen_concurrent_first_requests_start_one_llama_server(daemon: Daemon) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    def ask(_: int) -> int:
        return daemon.http("POST", "/v1/chat/completions", json=body).status_code

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert list(pool.map(ask, range(16))) == [200] * 16
    assert len(engine_pids(daemon)) == 1
    assert "modelrunner_runner_loads_total 1" in daemon.http("GET", "/metrics").text


def test_a_context_beyond_the_training_context_is_served_whole(daemon: Daemon) -> None:
    """llama-server caps a slot at the model's training context (512 tokens for the tiny model), silently
    but for its log; a configured 2048 is served with YaRN rope scaling (engines/llamacpp.py
    context_extension), so a ~730-token prompt fits where it would be refused."""
    assert daemon.cli("configure", "tiny", "--context-size", "2048").returncode == 0
    prompt = " ".join(["hello world"] * 60)  # ~12 tiny-vocabulary tokens each: ~730 in all
    body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    response = daemon.http("POST", "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] > 512
    out = daemon.cli("logs", "--no-engines").stdout
    [extended] = [line for line in out.splitlines() if " event=context_extended " in line]
    assert "trained=512" in extended and "context=2048" in extended and "how=yarn" in extended
