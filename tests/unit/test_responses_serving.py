"""The Responses API's logic (server/responses_serving.py) called directly, without HTTP: a response made
from the engine's chat completion, kept, paged and deleted; a stream of Responses events; unknown ids
refused with the 404 server/errors.py answers in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from modelrunner.compat import responses as shapes
from modelrunner.errors import ModelNotFound, ModelRunnerError
from modelrunner.server import responses_serving
from modelrunner.server.lifecycle import Inference
from modelrunner.server.responses_serving import ResponsesServing
from modelrunner.server.serving import EventStream
from tests.serving import EngineCalls, FakeCall, collect


def serving() -> ResponsesServing:
    return ResponsesServing(Inference(None, None, {}, None))  # type: ignore[arg-type]  # the engine is faked


def request(**fields: Any) -> shapes.ResponsesRequest:
    return shapes.check_request({"model": "ai/tiny", "input": "2+2?"} | fields)


def answered(text: str) -> FakeCall:
    message = {"role": "assistant", "content": text}
    return FakeCall(answer={"choices": [{"message": message, "finish_reason": "stop"}], "usage": {}})


def test_a_response_is_kept_paged_and_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = EngineCalls(monkeypatch, responses_serving, answered("4"), answered("5"))
    api = serving()
    first = asyncio.run(api.create(request()))
    assert isinstance(first, dict)
    assert (first["status"], first["output"][-1]["content"][0]["text"]) == ("completed", "4")
    assert api.get(first["id"]) == first
    asyncio.run(api.create(request(input="and +1?", previous_response_id=first["id"]), "llama.cpp"))
    sent = calls.sent[1][2]["messages"]
    assert [m["content"] for m in sent] == ["2+2?", "4", "and +1?"]  # the conversation so far
    assert calls.sent[1][5] == "llama.cpp"
    page = api.input_items(first["id"], "desc", 20, None)
    assert (len(page["data"]), page["has_more"]) == (1, False)
    assert api.delete(first["id"]) == {"id": first["id"], "object": "response", "deleted": True}
    with pytest.raises(ModelNotFound):
        api.get(first["id"])
    with pytest.raises(ModelNotFound):
        api.delete(first["id"])


def test_an_unknown_previous_response_is_refused_before_the_engine_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = EngineCalls(monkeypatch, responses_serving)
    with pytest.raises(ModelNotFound, match="no response with id 'resp_nope'"):
        asyncio.run(serving().create(request(previous_response_id="resp_nope")))
    assert calls.sent == []


def events(result: object) -> list[str]:
    assert isinstance(result, EventStream)
    text = asyncio.run(collect(result.events)).decode()
    return [json.loads(line[6:])["type"] for line in text.splitlines() if line.startswith("data: ")]


def test_a_stream_is_the_responses_events(monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [{"choices": [{"delta": {"content": "4"}, "finish_reason": "stop"}]}]
    call = FakeCall(events=chunks)
    EngineCalls(monkeypatch, responses_serving, call)
    found = events(asyncio.run(serving().create(request(stream=True))))
    assert found[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in found
    assert found[-1] == "response.completed"
    assert call.closed


def test_an_engine_that_fails_mid_stream_ends_it_with_response_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    call = FakeCall(events=[{"choices": [{"delta": {"content": "4"}}]}], fail=ModelRunnerError("engine died"))
    EngineCalls(monkeypatch, responses_serving, call)
    assert events(asyncio.run(serving().create(request(stream=True))))[-1] == "response.failed"
    assert call.closed
