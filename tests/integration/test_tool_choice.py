"""A forced tool choice is kept (compat/tool_choice.py): the real daemon on llama-server with the tiny GGUF,
whose template lists tools but renders no calls, driven by the official `openai` and `anthropic` clients.
On chat completions and Responses, `required` and a named function always give a call of a declared tool
whose arguments validate against its schema; `none` gives none (there and on Messages); a choice of an
undeclared tool is a 400 in each API's shape. (Anthropic `any`/`tool` on llama.cpp are not kept yet: the
engine's own `/v1/messages` takes no grammar; see compat/tool_choice.py.)"""

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


def test_none_is_no_tool_use(messages: anthropic.Anthropic) -> None:
    answer = messages.messages.create(
        model=MODEL,
        max_tokens=8,
        messages=HI,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "none"},
        extra_body=GREEDY,
    )
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
