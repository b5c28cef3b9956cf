"""A forced tool choice is kept (compat/tool_choice.py): the real daemon on llama-server with the tiny GGUF,
whose template lists tools but renders no calls, driven by the official `openai` and `anthropic` clients.
On chat completions and Responses, `required` and a named function always give a call of a declared tool
whose arguments validate against its schema; `none` gives none (there and on Messages); a choice of an
undeclared tool is a 400 in each API's shape. On Messages, `any` and a named `tool` always give a `tool_use`
block of a declared tool whose input validates (served through chat completions: compat/anthropic_chat.py),
streamed or not, a conversation with a `tool_result` sent back included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests.daemon import Daemon
from tests.engines import tiny_daemon
from tests.models import write_tiny_gguf

MODEL = "tiny-2k"  # the tiny GGUF with a 2048-token context

# Bounded arguments, so that the random weights finish the call well within max_tokens (and, without free
# strings, never write the broken UTF-8 of a lone byte token, which fails llama-server's own parser).
WEATHER = {
    "type": "object",
    "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["unit", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["utc", "cet"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
CHAT_TOOLS: Any = [
    {"type": "function", "function": {"name": name, "parameters": schema}} for name, schema in SCHEMAS.items()
]
RESPONSES_TOOLS: Any = [
    {"type": "function", "name": name, "parameters": schema} for name, schema in SCHEMAS.items()
]
ANTHROPIC_TOOLS: Any = [{"name": name, "input_schema": schema} for name, schema in SCHEMAS.items()]
HI: Any = [{"role": "user", "content": "weather in Paris?"}]
GREEDY: Any = {"temperature": 0}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("tool-choice")
    with tiny_daemon(home, llama_server) as running:
        # the tiny vocabulary spells the tools' JSON nearly a token a character: more than 512 tokens
        gguf = write_tiny_gguf(home / "long.gguf", context_length=2048)
        running.cli("package", "--gguf", str(gguf), MODEL)
        yield running


@pytest.fixture
def chat(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def messages(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)


def assert_valid_call(name: str, arguments: object, allowed: set[str]) -> None:
    assert name in allowed
    jsonschema.validate(arguments, SCHEMAS[name])


@pytest.mark.parametrize(
    ("choice", "allowed"),
    [
        ("required", set(SCHEMAS)),
        ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
    ],
)
def test_a_forced_chat_choice_is_a_valid_call(chat: openai.OpenAI, choice: Any, allowed: set[str]) -> None:
    answer = chat.chat.completions.create(
        model=MODEL, messages=HI, tools=CHAT_TOOLS, tool_choice=choice, max_tokens=120, **GREEDY
    )
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls" and message.tool_calls
    for call in message.tool_calls:
        assert call.type == "function"
        assert_valid_call(call.function.name, json.loads(call.function.arguments), allowed)


def test_a_forced_chat_stream_assembles_to_a_valid_call(chat: openai.OpenAI) -> None:
    choice: Any = {"type": "function", "function": {"name": "get_weather"}}
    stream = chat.chat.completions.create(
        model=MODEL, messages=HI, tools=CHAT_TOOLS, tool_choice=choice, max_tokens=120, stream=True, **GREEDY
    )
    names, arguments, text, finish = [], "", "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or []:
            names += [call.function.name] if call.function and call.function.name else []
            arguments += call.function.arguments or "" if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert (names, text, finish) == (["get_weather"], "", "tool_calls")
    assert_valid_call("get_weather", json.loads(arguments), {"get_weather"})


def test_none_is_no_chat_call(chat: openai.OpenAI) -> None:
    answer = chat.chat.completions.create(
        model=MODEL, messages=HI, tools=CHAT_TOOLS, tool_choice="none", max_tokens=8, **GREEDY
    )
    assert not answer.choices[0].message.tool_calls and answer.choices[0].finish_reason != "tool_calls"


@pytest.mark.parametrize(
    ("choice", "allowed"),
    [("required", set(SCHEMAS)), ({"type": "function", "name": "get_weather"}, {"get_weather"})],
)
def test_a_forced_responses_choice_is_a_function_call(
    chat: openai.OpenAI, choice: Any, allowed: set[str]
) -> None:
    response = chat.responses.create(
        model=MODEL,
        input="weather?",
        tools=RESPONSES_TOOLS,
        tool_choice=choice,
        max_output_tokens=120,
        **GREEDY,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and all(item.type == "function_call" for item in response.output)
    for call in calls:
        assert_valid_call(call.name, json.loads(call.arguments), allowed)


def create_message(client: anthropic.Anthropic, stream: bool, **fields: Any) -> anthropic.types.Message:
    """A message, asked for whole or as a stream the SDK puts together."""
    fields = {"model": MODEL, "tools": ANTHROPIC_TOOLS, "extra_body": GREEDY, **fields}
    if not stream:
        whole: anthropic.types.Message = client.messages.create(**fields)
        return whole
    with client.messages.stream(**fields) as events:
        return events.get_final_message()


def assert_tool_use(answer: anthropic.types.Message, allowed: set[str]) -> None:
    uses = [block for block in answer.content if block.type == "tool_use"]
    assert uses and answer.stop_reason == "tool_use"
    for use in uses:
        assert use.id.startswith("toolu_")
        assert_valid_call(use.name, use.input, allowed)
    assert answer.usage.input_tokens > 0 and answer.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("choice", "allowed"),
    [({"type": "any"}, set(SCHEMAS)), ({"type": "tool", "name": "get_time"}, {"get_time"})],
    ids=["any", "tool"],
)
def test_a_forced_messages_choice_is_a_valid_tool_use(
    messages: anthropic.Anthropic, choice: Any, allowed: set[str], stream: bool
) -> None:
    answer = create_message(messages, stream, max_tokens=120, messages=HI, tool_choice=choice)
    assert_tool_use(answer, allowed)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_result_sent_back_then_a_forced_call(messages: anthropic.Anthropic, stream: bool) -> None:
    first = create_message(
        messages, False, max_tokens=120, messages=HI, tool_choice={"type": "tool", "name": "get_weather"}
    )
    assert_tool_use(first, {"get_weather"})
    [use] = [block for block in first.content if block.type == "tool_use"]
    turns: Any = [
        *HI,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "9 degrees"},
                {"type": "text", "text": "and the time?"},
            ],
        },
    ]
    second = create_message(messages, stream, max_tokens=120, messages=turns, tool_choice={"type": "any"})
    assert_tool_use(second, set(SCHEMAS))
    assert second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0) > (
        first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    )  # the call and its result are part of the prompt


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_none_is_no_tool_use(messages: anthropic.Anthropic, stream: bool) -> None:
    answer = create_message(messages, stream, max_tokens=8, messages=HI, tool_choice={"type": "none"})
    assert all(block.type != "tool_use" for block in answer.content) and answer.stop_reason != "tool_use"


def test_a_choice_of_an_undeclared_tool_is_a_400_in_each_api(
    chat: openai.OpenAI, messages: anthropic.Anthropic
) -> None:
    with pytest.raises(openai.BadRequestError) as chat_error:
        chat.chat.completions.create(
            model=MODEL,
            messages=HI,
            tools=CHAT_TOOLS,
            tool_choice={"type": "function", "function": {"name": "launch_rocket"}},
        )
    with pytest.raises(openai.BadRequestError) as responses_error:
        chat.responses.create(
            model=MODEL, input="hi", tools=RESPONSES_TOOLS, tool_choice={"type": "function", "name": "nope"}
        )
    with pytest.raises(anthropic.BadRequestError) as messages_error:
        messages.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=HI,
            tools=ANTHROPIC_TOOLS,
            tool_choice={"type": "tool", "name": "launch_rocket"},
        )
    assert "launch_rocket" in chat_error.value.body["message"]  # type: ignore[index]
    assert "nope" in responses_error.value.body["message"]  # type: ignore[index]
    assert messages_error.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "launch_rocket" in messages_error.value.body["error"]["message"]  # type: ignore[index]
