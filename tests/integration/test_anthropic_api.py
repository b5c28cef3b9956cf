"""Anthropic's Messages API through the official `anthropic` client: real daemon, llama-server, tiny GGUF."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import MessageParam, TextBlockParam, ToolParam

from tests import golden
from tests.daemon import Daemon
from tests.engines import tiny_daemon

HI: list[MessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path_factory.mktemp("anthropic"), llama_server) as running:
        yield running


def client_for(daemon: Daemon, prefix: str = "/anthropic") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url + prefix, api_key="unused", max_retries=0)


@pytest.mark.parametrize("prefix", ["/anthropic", "", "/engines", "/engines/llama.cpp"])
def test_messages_not_streamed_on_every_route(daemon: Daemon, prefix: str) -> None:
    answer = client_for(daemon, prefix).messages.create(
        model="tiny", max_tokens=4, messages=HI, extra_body={"temperature": 0}
    )
    assert answer.type == "message" and answer.role == "assistant" and answer.model == "tiny"
    assert [block.type for block in answer.content] == ["text"]
    assert answer.stop_reason in ("max_tokens", "end_turn")  # random weights may end early
    assert 1 <= answer.usage.output_tokens <= 4


def test_system_as_a_string_and_as_blocks(daemon: Daemon) -> None:
    client = client_for(daemon)
    systems: tuple[str, list[TextBlockParam]] = (
        "Be brief.",
        [{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Really."}],
    )
    for system in systems:
        # greedy: with random sampling the first token is sometimes an incomplete UTF-8 sequence, and then
        # llama-server sends no message_start (the daemon then asks for the prompt's count:
        # tests/integration/test_message_start.py)
        answer = client.messages.create(
            model="tiny", max_tokens=2, system=system, messages=HI, extra_body={"temperature": 0, "top_k": 1}
        )
        # random weights may end at once (no content): the point is that both forms of system are accepted
        assert (
            answer.role == "assistant"
            and answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0) > 0
        )


def test_stream_matches_the_golden_transcript(daemon: Daemon) -> None:
    expected = golden.load("anthropic_messages_stream")
    events: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", daemon.url + "/anthropic/v1/messages", json=expected["request"], timeout=60
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        names = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    with httpx.stream("POST", daemon.url + "/v1/messages", json=expected["request"], timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert golden.collapse(names) == expected["sequence"]
    assert golden.collapse([e["type"] for e in events]) == expected["sequence"]
    golden.assert_keys(events[0]["message"], expected["message_start_keys"], "message_start")
    [delta] = [e for e in events if e["type"] == "message_delta"]
    golden.assert_keys(delta, expected["message_delta_keys"], "message_delta")
    golden.assert_keys(delta["usage"], expected["usage_keys"], "message_delta usage")
    assert delta["delta"]["stop_reason"] in ("max_tokens", "end_turn")


def test_the_client_stream_helper(daemon: Daemon) -> None:
    with client_for(daemon).messages.stream(model="tiny", max_tokens=4, messages=HI) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "message_stop" in kinds
    assert final.stop_reason in ("max_tokens", "end_turn") and final.usage.output_tokens >= 1


def test_tool_use_request_is_accepted(daemon: Daemon) -> None:
    tools: list[ToolParam] = [
        {
            "name": "weather",
            "description": "The weather in a city",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    messages: list[MessageParam] = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
    ]
    answer = client_for(daemon).messages.create(model="tiny", max_tokens=2, tools=tools, messages=messages)
    assert answer.stop_reason in ("max_tokens", "end_turn", "tool_use")


def test_count_tokens(daemon: Daemon) -> None:
    client = client_for(daemon)
    short = client.messages.count_tokens(model="tiny", messages=HI).input_tokens
    longer = client.messages.count_tokens(
        model="tiny", system="You are a helpful assistant.", messages=HI
    ).input_tokens
    assert 0 < short < longer


def test_claude_codes_request_with_a_system_message_in_messages(daemon: Daemon) -> None:
    """Claude Code 2.1.197's captured request shape (a `role: "system"` message after the user's, adaptive
    thinking, context management), its texts shortened and its tools left out (the tiny model's context is
    512 tokens): llama-server answers it, and counts the system message."""
    captured = golden.load("claude_code_2_1_197_request")
    request = {**captured["body"], "model": "tiny", "max_tokens": 4, "temperature": 0, "top_k": 1}
    request["system"] = captured["body"]["system"][:1]
    request["messages"] = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": "Available agent types: Explore, Plan."},
    ]
    del request["tools"]
    headers = {"anthropic-beta": captured["headers"]["anthropic-beta"]}
    with httpx.stream(
        "POST", daemon.url + "/v1/messages?beta=true", json=request, headers=headers, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        kinds = [json.loads(line[6:])["type"] for line in r.iter_lines() if line.startswith("data: ")]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    counted = {k: v for k, v in request.items() if k in ("model", "system", "messages")}
    both = daemon.http("POST", "/v1/messages/count_tokens", json=counted).json()["input_tokens"]
    user_only = daemon.http(
        "POST", "/v1/messages/count_tokens", json={**counted, "messages": counted["messages"][:1]}
    ).json()["input_tokens"]
    assert both > user_only > 0


def test_unknown_model_is_a_not_found_error(daemon: Daemon) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client_for(daemon).messages.create(model="absent", max_tokens=4, messages=HI)
    assert missing.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model: absent not found"},
    }
    with pytest.raises(anthropic.NotFoundError):
        client_for(daemon, "").messages.count_tokens(model="absent", messages=HI)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b"[" * 100_000,  # nested deeper than any parser's stack
        b'{"model": "tiny", "max_tokens": 4}',
        b'{"model": "tiny", "max_tokens": 4, "messages": [{"role": "robot", "content": "hi"}]}',
        b'{"model": "tiny", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}',
        b'{"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}',
    ],
)
def test_malformed_bodies_are_invalid_request_errors(daemon: Daemon, body: bytes) -> None:
    for path in ("/anthropic/v1/messages", "/v1/messages"):
        response = daemon.http("POST", path, content=body)
        assert response.status_code == 400, response.text
        doc = response.json()
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        assert doc["error"]["message"]
