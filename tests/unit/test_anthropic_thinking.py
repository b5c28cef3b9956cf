"""Thinking on the Messages requests served through chat completions (compat/anthropic_chat.py): a past
turn's thinking goes to the engine as `reasoning_content`, the engine's reasoning comes back as a thinking
block with a signature, streamed with its `signature_delta` before the block stops."""

from __future__ import annotations

import json
from typing import Any

from modelrunner.compat import anthropic_chat
from modelrunner.compat.thinking_signature import signature
from modelrunner.wire import SSEDecoder

TOOLS: Any = [{"name": "get_weather", "input_schema": {"type": "object"}}]
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}


def request(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 50,
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": {"type": "none"},
        **fields,
    }


def test_past_thinking_is_the_turns_reasoning_content() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "first ", "signature": "anything"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "thinking", "thinking": "then call", "signature": "s"},
                USE,
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "9C"}]},
    ]
    chat = anthropic_chat.chat_request(request(messages))["messages"]
    assert chat[1]["role"] == "assistant" and chat[1]["reasoning_content"] == "first then call"
    assert chat[1]["tool_calls"][0]["id"] == "toolu_1" and chat[2]["role"] == "tool"
    assert all("reasoning_content" not in m for m in (chat[0], chat[2]))


def test_a_turn_of_thinking_alone_is_an_empty_assistant_message_with_it() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}]},
        {"role": "user", "content": "go on"},
    ]
    chat = anthropic_chat.chat_request(request(messages))["messages"]
    assert chat[1] == {"role": "assistant", "content": "", "reasoning_content": "hmm"}


def test_consecutive_assistant_turns_are_one_chat_turn() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Looking."},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "call", "signature": "s"}, USE]},
    ]
    [_, turn] = anthropic_chat.chat_request(request(messages))["messages"]
    assert (turn["content"], turn["reasoning_content"]) == ("Looking.", "call")
    assert [c["id"] for c in turn["tool_calls"]] == ["toolu_1"]


def test_thinking_enabled_is_llama_servers_budget() -> None:
    hi = [{"role": "user", "content": "hi"}]
    enabled = {"type": "enabled", "budget_tokens": 2048}
    assert anthropic_chat.chat_request(request(hi, thinking=enabled))["thinking_budget_tokens"] == 2048
    disabled = anthropic_chat.chat_request(request(hi, thinking={"type": "disabled"}))
    assert "thinking_budget_tokens" not in disabled


COMPLETION = {
    "choices": [
        {"finish_reason": "stop", "message": {"reasoning_content": "let me see", "content": "Hello."}}
    ]
}


def test_the_answers_reasoning_is_a_signed_thinking_block() -> None:
    thinking, text = anthropic_chat.message(COMPLETION, "m")["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "let me see"
    assert thinking["signature"] and thinking["signature"] == signature("let me see")
    assert signature("other") != thinking["signature"]
    assert text == {"type": "text", "text": "Hello."}


def test_a_streamed_thinking_block_ends_with_its_signature_delta() -> None:
    done = anthropic_chat.message(COMPLETION, "m")
    events = [(e, json.loads(p)) for e, p in SSEDecoder().feed(b"".join(anthropic_chat.message_events(done)))]
    thinking = [doc for _, doc in events if doc.get("index") == 0]
    assert [doc["type"] for doc in thinking] == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
    ]
    assert thinking[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert thinking[1]["delta"] == {"type": "thinking_delta", "thinking": "let me see"}
    assert thinking[2]["delta"] == {"type": "signature_delta", "signature": done["content"][0]["signature"]}
