"""Ollama's API through the official `ollama` client: a real daemon, a real llama-server, the tiny GGUF."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests import golden
from tests.daemon import Daemon, json_lines
from tests.engines import tiny_daemon
from tests.models import write_tiny_gguf
from tests.registry import Registry


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    # its Docker config is its own empty one (tests/daemon.py runner_env): no credentials
    with tiny_daemon(tmp_path_factory.mktemp("ollama"), llama_server) as running:
        yield running


@pytest.fixture
def client(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url)


def engine_argv(daemon: Daemon) -> list[bytes]:
    [runner] = [r for r in daemon.http("GET", "/engines/ps").json() if r["mode"] == "completion"]
    return Path(f"/proc/{runner['pid']}/cmdline").read_bytes().split(b"\0")


EXACT = {"num_predict": 4, "ignore_eos": True, "temperature": 0}  # exact token counts


def test_version_tags_show(client: ollama.Client, daemon: Daemon) -> None:
    assert daemon.http("GET", "/api/version").json() == {"version": "0.1.0"}
    [model] = client.list().models
    # Ollama leaves its default namespace out: `ai/tiny:latest` is listed as `tiny:latest`
    assert model.model == "tiny:latest" and model.size and model.digest and len(model.digest) == 64
    assert model.details is not None and model.details.format == "gguf" and model.details.family == "llama"
    shown = client.show("tiny")
    assert shown.details is not None and shown.details.quantization_level == "MOSTLY_F32"
    assert "im_start" in (shown.template or "") and shown.capabilities and "completion" in shown.capabilities


def test_chat_not_streamed(client: ollama.Client) -> None:
    answer = client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options=EXACT)
    assert answer.done and answer.done_reason == "length"
    assert answer.eval_count == 4 and answer.prompt_eval_count and answer.prompt_eval_count > 0
    assert answer.message.role == "assistant" and isinstance(answer.message.content, str)
    assert answer.total_duration is not None and answer.load_duration is not None


def test_chat_streamed_matches_the_golden_transcript(client: ollama.Client) -> None:
    expected = golden.load("ollama_chat_stream")
    request = expected["request"]
    parts = [p.model_dump() for p in client.chat(**request, stream=True)]
    kinds = ["done" if p["done"] else "chunk" for p in parts]
    assert golden.collapse(kinds) == expected["sequence"]
    for part in parts[:-1]:
        golden.assert_keys(part, expected["chunk_keys"], "a chunk")
        assert part["message"]["role"] == "assistant"
    final = parts[-1]
    golden.assert_keys({k: v for k, v in final.items() if v is not None}, expected["final_keys"], "the end")
    for key, value in expected["final"].items():
        assert final[key] == value or (isinstance(value, dict) and value.items() <= final[key].items()), key


def test_ps_lists_the_loaded_model(client: ollama.Client) -> None:
    client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 1})
    running = client.ps().models
    assert [m.model for m in running] == ["tiny:latest"]  # as Ollama names it
    assert running[0].expires_at is not None and running[0].context_length == 512


def test_generate_streamed_and_not(client: ollama.Client) -> None:
    answer = client.generate(model="tiny", prompt="Once", system="Be brief.", options=EXACT)
    assert answer.done and answer.eval_count == 4 and isinstance(answer.response, str)
    parts = list(client.generate(model="tiny", prompt="Once", options=EXACT, stream=True))
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done and parts[-1].eval_count == 4
    raw = client.generate(model="tiny", prompt="Once upon", raw=True, options=EXACT)
    assert raw.eval_count == 4


def test_embed_and_embeddings(client: ollama.Client) -> None:
    answer = client.embed(model="tiny", input=["hello", "world"])
    assert [len(v) for v in answer.embeddings] == [64, 64]  # n_embd of the tiny model
    assert answer.prompt_eval_count and answer.prompt_eval_count > 0
    assert len(client.embed(model="tiny", input="hello", dimensions=8).embeddings[0]) == 8
    assert len(client.embeddings(model="tiny", prompt="hello").embedding) == 64


def norm(vector: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


def test_embed_normalises_then_shortens_and_normalises_again(client: ollama.Client) -> None:
    """Ollama's EmbedHandler: each vector L2-normalised; `dimensions` keeps the first values and
    normalises them again; a `dimensions` beyond the model's size keeps the whole vector."""
    [full] = client.embed(model="tiny", input="hello").embeddings
    assert norm(full) == pytest.approx(1.0, abs=1e-5)
    [short] = client.embed(model="tiny", input="hello", dimensions=8).embeddings
    assert len(short) == 8 and norm(short) == pytest.approx(1.0, abs=1e-5)
    assert short == pytest.approx([v / norm(full[:8]) for v in full[:8]], abs=1e-5)
    assert client.embed(model="tiny", input="hello", dimensions=1000).embeddings[0] == pytest.approx(full)


def test_embed_truncates_an_input_beyond_the_context_unless_told_not_to(client: ollama.Client) -> None:
    """Ollama's default `truncate: true` cuts the input's end to fit the context; `false` is its 400."""
    too_long = "hello world " * 400  # ~4800 tokens of the tiny vocabulary, the context is 512 or less
    answer = client.embed(model="tiny", input=[too_long, "hello"])
    cut, short = answer.embeddings
    assert len(cut) == 64 and norm(cut) == pytest.approx(1.0, abs=1e-5)
    assert short == pytest.approx(client.embed(model="tiny", input="hello").embeddings[0])
    # only the end is lost: a longer text with the same beginning embeds to the same vector
    longer = client.embed(model="tiny", input=too_long + "a different ending").embeddings[0]
    assert longer == pytest.approx(cut)
    assert answer.prompt_eval_count is not None and answer.prompt_eval_count <= 512 + 10
    for explicitly in (True, None):
        assert client.embed(model="tiny", input=too_long, truncate=explicitly).embeddings[0] == pytest.approx(
            cut
        )
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="tiny", input=[too_long, "hello"], truncate=False)
    assert refused.value.status_code == 400
    assert refused.value.error == "the input length exceeds the context length"  # Ollama's words


def test_empty_prompt_loads_and_keep_alive_zero_unloads(client: ollama.Client, daemon: Daemon) -> None:
    loaded = client.generate(model="tiny", prompt="")
    assert loaded.done and loaded.done_reason == "load"
    assert [r["mode"] for r in daemon.http("GET", "/engines/ps").json()].count("completion") == 1
    unloaded = client.generate(model="tiny", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert daemon.http("GET", "/engines/ps").json() == []
    chat = client.chat(model="tiny", messages=[])
    assert chat.done_reason == "load" and chat.message.content == ""


def test_num_ctx_becomes_the_persisted_context_size(client: ollama.Client, daemon: Daemon) -> None:
    client.chat(
        model="tiny", messages=[{"role": "user", "content": "hi"}], options={"num_ctx": 256, "num_predict": 1}
    )
    argv = engine_argv(daemon)
    assert argv[argv.index(b"--ctx-size") + 1] == b"256"
    [config] = daemon.http("GET", "/engines/_configure?model=tiny").json()
    assert config["Config"]["context-size"] == 256
    client.chat(
        model="tiny", messages=[{"role": "user", "content": "hi"}], options={"num_ctx": 512, "num_predict": 1}
    )
    argv = engine_argv(daemon)
    assert argv[argv.index(b"--ctx-size") + 1] == b"512"


def test_keep_alive_durations(client: ollama.Client, daemon: Daemon) -> None:
    client.generate(model="tiny", prompt="", keep_alive="1h")
    assert [r["keep_alive"] for r in daemon.http("GET", "/engines/ps").json()] == ["1h0m0s"]
    client.generate(model="tiny", prompt="", keep_alive=-1)
    assert [r["keep_alive"] for r in daemon.http("GET", "/engines/ps").json()] == ["-1"]
    with pytest.raises(ollama.ResponseError) as bad:
        client.generate(model="tiny", prompt="", keep_alive="soon")
    assert bad.value.status_code == 400


def test_tools_are_accepted(client: ollama.Client) -> None:
    tool: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "weather"},
    ]
    answer = client.chat(model="tiny", messages=messages, tools=[tool], options={"num_predict": 2})
    assert answer.done
    parts = list(
        client.chat(model="tiny", messages=messages, tools=[tool], options={"num_predict": 2}, stream=True)
    )
    assert parts[-1].done


def test_copy_and_delete(client: ollama.Client) -> None:
    assert client.copy("tiny", "tiny-copy").status == "success"
    assert sorted(m.model or "" for m in client.list().models) == ["tiny-copy:latest", "tiny:latest"]
    assert client.delete("tiny-copy").status == "success"
    assert [m.model for m in client.list().models] == ["tiny:latest"]
    with pytest.raises(ollama.ResponseError) as missing:
        client.delete("tiny-copy")
    assert missing.value.status_code == 404


def test_errors_have_ollama_shape(client: ollama.Client, daemon: Daemon) -> None:
    with pytest.raises(ollama.ResponseError) as unknown:
        client.chat(model="absent", messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.status_code == 404 and "absent" in unknown.value.error
    for path, body in (
        ("/api/chat", b"{not json"),
        ("/api/chat", b'{"messages": []}'),
        ("/api/generate", b'{"model": "tiny", "prompt": 3}'),
        (
            "/api/chat",
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "options": {"num_ctx": -1}}',
        ),
        ("/api/embed", b'{"model": "tiny", "input": []}'),
        ("/api/copy", b'{"source": "tiny"}'),
    ):
        response = daemon.http("POST", path, content=body)
        assert response.status_code == 400, (path, body, response.text)
        doc = response.json()
        assert set(doc) == {"error"} and isinstance(doc["error"], str) and doc["error"]
    response = daemon.http("POST", "/api/show", json={"model": "absent"})
    assert response.status_code == 404 and set(response.json()) == {"error"}


def test_push_then_pull_from_a_registry(client: ollama.Client, daemon: Daemon, tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry", auth="none").start()
    try:
        ref = f"{registry.host}/team/tiny:v1"
        other = write_tiny_gguf(tmp_path / "other.gguf", seed=1)  # blobs of its own, so the pull downloads
        daemon.cli("package", "--gguf", str(other), ref)
        pushed = [p.model_dump() for p in client.push(ref, stream=True)]
        assert pushed[0]["status"] == "retrieving manifest" and pushed[-1]["status"] == "success"
        assert any(p["digest"] and p["total"] for p in pushed)
        client.delete(ref)
        with httpx.stream("POST", daemon.url + "/api/pull", json={"model": ref}, timeout=120) as response:
            assert response.headers["content-type"].startswith("application/x-ndjson")
            pulled = json_lines(response.read().decode())
        assert pulled[0] == {"status": "pulling manifest"} and pulled[-1] == {"status": "success"}
        layers = [p for p in pulled if "digest" in p]
        assert layers and layers[-1]["completed"] == layers[-1]["total"]
        assert ref in [m.model for m in client.list().models]
        assert client.pull(ref).status == "success"  # cached now, not streamed
        client.delete(ref)
        with pytest.raises(ollama.ResponseError) as missing:
            client.pull(f"{registry.host}/team/absent:v1")
        assert missing.value.status_code == 404
    finally:
        registry.stop()


@pytest.mark.parametrize("body", [b"{not json", b"[]", b"[" * 100_000])
def test_malformed_bodies_are_400(daemon: Daemon, body: bytes) -> None:
    for path in ("/api/chat", "/api/generate", "/api/embed", "/api/show", "/api/pull", "/api/copy"):
        response = daemon.http("POST", path, content=body)
        assert response.status_code == 400, (path, response.text)
        assert response.json()["error"]
