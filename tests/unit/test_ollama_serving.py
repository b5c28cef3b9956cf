"""The Ollama API's logic (server/ollama_serving.py) called directly, without HTTP: answers translated
from the engine's chat completions, streams as NDJSON lines, the load/unload idiom, and bad input refused
with the error server/errors.py answers in Ollama's shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from modelrunner.compat import ollama as shapes
from modelrunner.engines.registry import EngineRegistry, default_registry
from modelrunner.errors import BadRequest, ModelNotFound, ModelRunnerError
from modelrunner.server import ollama_serving
from modelrunner.server.lifecycle import Inference
from modelrunner.server.ollama_serving import OllamaServing
from modelrunner.server.serving import LineStream
from modelrunner.store.store import ModelStore
from tests.serving import EngineCalls, FakeCall, FakeScheduler, collect


def serving(
    store: ModelStore, scheduler: FakeScheduler | None = None, transfers: Any = None
) -> OllamaServing:
    engines = EngineRegistry.of(default_registry())  # /api/show asks the model's engine
    ctx = Inference(store, scheduler or FakeScheduler(), engines, None)  # type: ignore[arg-type]
    return OllamaServing(ctx, transfers)


def lines(result: object) -> list[dict[str, Any]]:
    assert isinstance(result, LineStream)
    return [json.loads(line) for line in asyncio.run(collect(result.lines)).splitlines()]


def test_tags_and_show_name_models_as_ollama_clients_do(store: ModelStore, tiny_model: str) -> None:
    api = serving(store)
    assert api.version() == {"version": "0.1.0"}
    assert [entry["name"] for entry in api.tags()["models"]] == ["tiny:latest"]
    assert "modelfile" in api.show(shapes.PullRequest(model="ai/tiny"))


def test_an_unknown_model_is_not_found_in_ollama_words(store: ModelStore) -> None:
    with pytest.raises(ModelNotFound, match=r"^model 'nope' not found$"):
        serving(store).show(shapes.PullRequest(model="nope"))


def test_a_request_without_a_model_is_refused(store: ModelStore) -> None:
    with pytest.raises(BadRequest, match="model is required"):
        asyncio.run(
            serving(store).chat(shapes.ChatRequest(messages=[shapes.Message(role="user", content="hi")]))
        )


def test_chat_answers_the_engine_message(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = {"content": "4", "reasoning_content": "2+2", "tool_calls": None}
    call = FakeCall(answer={"choices": [{"message": message, "finish_reason": "stop"}], "usage": {}})
    calls = EngineCalls(monkeypatch, ollama_serving, call)
    body = shapes.ChatRequest(
        model="ai/tiny", messages=[shapes.Message(role="user", content="2+2?")], stream=False
    )
    answer = asyncio.run(serving(store).chat(body))
    assert isinstance(answer, dict)
    assert answer["message"] == {"role": "assistant", "content": "4", "thinking": "2+2"}
    assert (answer["done"], answer["done_reason"]) == (True, "stop")
    assert calls.sent[0][1] == "/v1/chat/completions"
    assert call.closed


def test_a_streamed_generate_is_ndjson_ending_with_done(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks: list[dict[str, Any]] = [
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}, "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ]
    call = FakeCall(events=chunks)
    EngineCalls(monkeypatch, ollama_serving, call)
    found = lines(asyncio.run(serving(store).generate(shapes.GenerateRequest(model="ai/tiny", prompt="Hi"))))
    assert [line["response"] for line in found] == ["Hel", "lo", ""]
    assert [line["done"] for line in found] == [False, False, True]
    assert (found[-1]["done_reason"], found[-1]["prompt_eval_count"], found[-1]["eval_count"]) == (
        "length",
        3,
        2,
    )
    assert call.closed


def test_an_engine_that_fails_mid_stream_ends_it_with_an_error_line(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = FakeCall(events=[{"choices": [{"delta": {"content": "a"}}]}], fail=ModelRunnerError("engine died"))
    EngineCalls(monkeypatch, ollama_serving, call)
    body = shapes.ChatRequest(model="ai/tiny", messages=[shapes.Message(role="user", content="hi")])
    found = lines(asyncio.run(serving(store).chat(body)))
    assert found[-1] == {"error": "engine died"}
    assert call.closed


def test_an_empty_chat_with_keep_alive_0_unloads(store: ModelStore, tiny_model: str) -> None:
    scheduler = FakeScheduler()
    answer = asyncio.run(serving(store, scheduler).chat(shapes.ChatRequest(model="ai/tiny", keep_alive=0)))
    assert isinstance(answer, dict)
    assert answer == answer | {"message": {"role": "assistant", "content": ""}, "done_reason": "unload"}
    assert scheduler.unloaded == [({tiny_model}, None)]


def test_embed_shortens_to_the_dimensions_asked_and_normalises_again(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = [{"index": 1, "embedding": [3.0, 4.0, 5.0]}, {"index": 0, "embedding": [1.0, 2.0, 3.0]}]
    EngineCalls(monkeypatch, ollama_serving, FakeCall(answer={"data": data, "usage": {"prompt_tokens": 2}}))
    body = shapes.EmbedRequest(model="ai/tiny", input=["a", "b"], dimensions=2)
    answer = asyncio.run(serving(store).embed(body))
    assert answer["embeddings"] == [pytest.approx([1 / 5**0.5, 2 / 5**0.5]), pytest.approx([0.6, 0.8])]
    assert answer["prompt_eval_count"] == 2


class _FailedJob:
    """A transfer that started, then failed: its events say so."""

    detached = False

    def wait_resolved(self) -> None:
        return None

    def next_events(self, index: int, timeout: float) -> tuple[list[dict[str, Any]], bool]:
        return [{"type": "error", "message": "unauthorized"}], True

    def detach(self) -> None:
        self.detached = True


class _Transfers:
    def __init__(self) -> None:
        self.job = _FailedJob()

    def start_pull(self, name: str) -> _FailedJob:
        return self.job


def test_a_failed_pull_not_streamed_is_an_error(store: ModelStore) -> None:
    transfers = _Transfers()
    with pytest.raises(ModelRunnerError) as info:
        asyncio.run(serving(store, transfers=transfers).pull(shapes.PullRequest(model="ai/x", stream=False)))
    assert info.value.status_code == 500
    assert transfers.job.detached
