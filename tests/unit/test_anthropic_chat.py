"""compat/anthropic_chat.py: which Messages requests go through chat completions, the chat request they
become (and the forced-choice request llama-server then gets), and the chat answer as an Anthropic message
and its events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelrunner.compat import anthropic_chat
from modelrunner.compat.assemble import CHAT, MESSAGES
from modelrunner.compat.tool_choice import engine_request, forced
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.engines.vllm import VllmEngine
from modelrunner.errors import BadRequest
from modelrunner.wire import SSEDecoder

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: Any = [
    {"name": "get_weather", "description": "Weather now", "input_schema": CITY},
    {"type": "web_search_20250305", "name": "web"},
]


ENGINES = {"llama.cpp": LlamaCppEngine, "vllm": VllmEngine}  # the facts the daemon reads from each


def request(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": "m",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": TOOLS,
        "tool_choice": {"type": "any"},
    }
    return {**doc, **fields}


@pytest.mark.parametrize(
    ("engine", "doc", "through"),
    [
        ("llama.cpp", request(), True),
        ("llama.cpp", request(tool_choice={"type": "tool", "name": "get_weather"}), True),
        ("llama.cpp", request(tool_choice={"type": "none"}), True),
        ("llama.cpp", request(tool_choice={"type": "auto"}), False),  # the engine's own Messages keeps it
        ("llama.cpp", request(tools=[]), False),
        ("vllm", request(), False),  # vLLM's Messages maps any/tool/none to chat choices it enforces
    ],
)
def test_which_requests_go_through_chat(engine: str, doc: dict[str, Any], through: bool) -> None:
    forces = ENGINES[engine].ignores_forced_tool_choice
    assert anthropic_chat.through_chat(forces, MESSAGES, doc) is through
    assert not anthropic_chat.through_chat(forces, MESSAGES + "/count_tokens", doc)


def test_a_conversation_with_a_call_and_its_result_becomes_chat_messages() -> None:
    doc = request(
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "call it", "signature": "s"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "9C"}],
                    },
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
        ],
        temperature=0,
        top_p=0.9,
        top_k=5,
        stop_sequences=["END"],
        stream=True,
    )
    body = anthropic_chat.chat_request(doc)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": "call it",  # as llama-server's own Messages translation sends it
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "9C"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": CITY, "description": "Weather now"},
        }
    ]
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["top_k"]) == (50, 0, 0.9, 5)
    assert body["stop"] == ["END"] and body["tool_choice"] == "required"
    assert "stream" not in body  # the daemon streams the finished message itself


@pytest.mark.parametrize(
    ("choice", "chat_choice"),
    [
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
        ({"type": "none"}, "none"),
    ],
)
def test_choices_become_chat_choices(choice: Any, chat_choice: Any) -> None:
    assert anthropic_chat.chat_request(request(tool_choice=choice))["tool_choice"] == chat_choice


def test_a_forced_choice_takes_the_forced_chat_path() -> None:
    doc = request(tool_choice={"type": "tool", "name": "get_weather"})
    choice = forced(MESSAGES, doc)
    body, tools = engine_request(
        LlamaCppEngine.ignores_forced_tool_choice, CHAT, anthropic_chat.chat_request(doc), choice
    )
    assert body["tool_choice"] == "none" and body["response_format"]["type"] == "json_schema"
    assert tools == {"get_weather": CITY}
    none = anthropic_chat.chat_request(request(tool_choice={"type": "none"}))
    assert engine_request(
        LlamaCppEngine.ignores_forced_tool_choice,
        CHAT,
        none,
        forced(MESSAGES, request(tool_choice={"type": "none"})),
    ) == (
        none,
        None,
    )


def test_an_image_becomes_a_data_url() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    body = anthropic_chat.chat_request(request(messages=[{"role": "user", "content": [image]}]))
    assert body["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    ]


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "tool_result", "content": "9C"}],  # no tool_use_id
        [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}],  # a user's call
        [{"type": "document", "source": {}}],
        [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
        [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}],
    ],
)
def test_blocks_it_cannot_translate_are_a_400(content: Any) -> None:
    with pytest.raises(BadRequest):
        anthropic_chat.chat_request(request(messages=[{"role": "user", "content": content}]))


COMPLETION = {
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 30, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 20}},
}


def test_a_chat_call_becomes_a_tool_use_message() -> None:
    done = anthropic_chat.message(COMPLETION, "m")
    assert done["id"].startswith("msg_") and done["model"] == "m" and done["type"] == "message"
    [block] = done["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
    assert (block["name"], block["input"]) == ("get_weather", {"city": "Paris"})
    assert done["stop_reason"] == "tool_use"
    assert done["usage"] == {"input_tokens": 10, "cache_read_input_tokens": 20, "output_tokens": 7}


def test_a_text_answer_cut_by_max_tokens_says_so() -> None:
    completion = {"choices": [{"finish_reason": "length", "message": {"content": '{"name": "get'}}]}
    done = anthropic_chat.message(completion, "m")
    assert done["content"] == [{"type": "text", "text": '{"name": "get'}]
    assert done["stop_reason"] == "max_tokens"


def test_the_message_events_rebuild_the_message() -> None:
    done = anthropic_chat.message(COMPLETION, "m")
    done["content"].insert(0, {"type": "text", "text": "Looking."})
    events = [(e, json.loads(p)) for e, p in SSEDecoder().feed(b"".join(anthropic_chat.message_events(done)))]
    kinds = [e for e, _ in events]
    assert kinds == [
        "message_start",
        *["content_block_start", "content_block_delta", "content_block_stop"] * 2,
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["id"] == done["id"] and start["content"] == [] and start["usage"]["input_tokens"] == 10
    assert events[2][1]["delta"] == {"type": "text_delta", "text": "Looking."}
    assert events[4][1]["content_block"] == {**done["content"][1], "input": {}}
    assert json.loads(events[5][1]["delta"]["partial_json"]) == {"city": "Paris"}
    assert events[7][1]["delta"]["stop_reason"] == "tool_use" and events[7][1]["usage"] == done["usage"]
