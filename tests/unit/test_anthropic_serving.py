"""The Messages API's logic (server/anthropic_serving.py) called directly, without HTTP: the request and
the model checked before the engine is asked, the engine's answer relayed as it is."""

from __future__ import annotations

import asyncio
import json

import pytest

from modelrunner.compat.assemble import CHAT
from modelrunner.errors import BadRequest, ModelNotFound
from modelrunner.server import anthropic_serving
from modelrunner.server.anthropic_serving import AnthropicServing
from modelrunner.server.lifecycle import Inference
from modelrunner.server.serving import EventStream, RawAnswer
from modelrunner.store.store import ModelStore
from modelrunner.wire import sse_events
from tests.serving import EngineCalls, FakeCall, FakeScheduler, collect
from tests.unit.test_anthropic_chat import COMPLETION
from tests.unit.test_thinking_signature import SIGNED, THOUGHT, llama_server_stream

MESSAGE = {"model": "ai/tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def serving(store: ModelStore) -> AnthropicServing:
    return AnthropicServing(Inference(store, FakeScheduler(), {}, None))  # type: ignore[arg-type]


def test_an_answer_is_relayed_as_the_engine_sent_it(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = EngineCalls(monkeypatch, anthropic_serving, FakeCall(raw=(200, b'{"type":"message"}')))
    answer = asyncio.run(serving(store).messages(MESSAGE | {"keep_alive": "5m"}, "llama.cpp"))
    assert answer == RawAnswer(200, b'{"type":"message"}')
    name, path, body, _, keep_alive, backend = calls.sent[0]
    assert (name, path, keep_alive, backend) == ("ai/tiny", "/v1/messages", 300, "llama.cpp")
    assert "keep_alive" not in body  # ours, not the engine's


def test_count_tokens_goes_to_its_own_path(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = EngineCalls(monkeypatch, anthropic_serving, FakeCall(raw=(200, b'{"input_tokens":3}')))
    doc = {"model": "ai/tiny", "messages": MESSAGE["messages"]}
    assert asyncio.run(serving(store).messages(doc, count_tokens=True)) == RawAnswer(
        200, b'{"input_tokens":3}'
    )
    assert calls.sent[0][1] == "/v1/messages/count_tokens"


def test_a_stream_opens_with_message_start(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = FakeCall(raw=(200, b'event: content_block_delta\ndata: {"type":"content_block_delta"}\n\n'))
    EngineCalls(monkeypatch, anthropic_serving, call)
    result = asyncio.run(serving(store).messages(MESSAGE | {"stream": True}))
    assert isinstance(result, EventStream)
    assert asyncio.run(collect(result.events)).startswith(b"event: message_start")
    assert call.closed


def test_an_unknown_model_or_a_bad_body_never_reaches_the_engine(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = EngineCalls(monkeypatch, anthropic_serving)
    with pytest.raises(ModelNotFound, match="model: nope not found"):
        asyncio.run(serving(store).messages(MESSAGE | {"model": "nope"}))
    with pytest.raises(BadRequest, match="max_tokens"):
        asyncio.run(serving(store).messages({"model": "ai/tiny", "messages": MESSAGE["messages"]}))
    assert calls.sent == []


def test_an_answer_through_chat_is_an_anthropic_message(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forced choice on llama.cpp (compat/anthropic_chat.py): the chat completion comes back as a
    message with its call as a `tool_use` block, unstreamed and streamed."""
    unstreamed, streamed = FakeCall(answer=COMPLETION, path=CHAT), FakeCall(answer=COMPLETION, path=CHAT)
    EngineCalls(monkeypatch, anthropic_serving, unstreamed, streamed)
    answer = asyncio.run(serving(store).messages(dict(MESSAGE)))
    assert isinstance(answer, dict) and answer["stop_reason"] == "tool_use"
    assert [block["type"] for block in answer["content"]] == ["tool_use"] and unstreamed.closed
    result = asyncio.run(serving(store).messages(MESSAGE | {"stream": True}))
    assert isinstance(result, EventStream)
    events = asyncio.run(collect(result.events)).split(b"\n\n")
    assert (
        events[0].startswith(b"event: message_start")
        and events[-2] == b'event: message_stop\ndata: {"type": "message_stop"}'
    )
    delta = json.loads(events[-3].split(b"data: ", 1)[1])
    assert delta["delta"]["stop_reason"] == "tool_use" and streamed.closed


def test_the_engines_thinking_is_signed_unstreamed_and_streamed(
    store: ModelStore, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server's own Messages (b11434) signs with an empty string: the daemon's signature instead,
    on the relayed stream and on a stream parsed for tools (`rescued_events`) alike."""
    thinking = {"type": "thinking", "thinking": "".join(THOUGHT), "signature": ""}
    body = json.dumps({"type": "message", "content": [thinking, {"type": "text", "text": "Hi"}]}).encode()
    stream = b"".join(llama_server_stream())
    relayed, rescued = FakeCall(raw=(200, stream)), FakeCall(raw=(200, stream))
    rescued.tools = {"get_weather": {"type": "object"}}
    EngineCalls(monkeypatch, anthropic_serving, FakeCall(raw=(200, body)), relayed, rescued)
    answer = asyncio.run(serving(store).messages(dict(MESSAGE)))
    assert isinstance(answer, RawAnswer) and json.loads(answer.body)["content"][0]["signature"] == SIGNED
    for _ in (relayed, rescued):
        result = asyncio.run(serving(store).messages(MESSAGE | {"stream": True}))
        assert isinstance(result, EventStream)
        events = [json.loads(data) for _, data in sse_events(asyncio.run(collect(result.events)))]
        signed = [e for e in events if e.get("delta", {}).get("type") == "signature_delta"]
        assert [(e["index"], e["delta"]["signature"]) for e in signed] == [(0, SIGNED)]
        assert events[events.index(signed[0]) + 1] == {"type": "content_block_stop", "index": 0}
