"""compat/tool_choice.py: which tool choices force a call, the 400s for a choice of an undeclared tool, and
the request llama-server gets so that it keeps the choice."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from modelrunner.compat.assemble import CHAT, MESSAGES
from modelrunner.compat.tool_choice import Forced, engine_request, forced
from modelrunner.compat.tool_rescue import rescue
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.engines.vllm import VllmEngine
from modelrunner.errors import BadRequest

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time"}},
]
MESSAGES_TOOLS = [
    {"name": "get_weather", "input_schema": CITY},
    {"type": "web_search_20250305", "name": "web"},
]


@pytest.mark.parametrize(
    ("path", "tools", "choice", "names"),
    [
        (CHAT, CHAT_TOOLS, "required", ["get_weather", "get_time"]),
        (CHAT, CHAT_TOOLS, {"type": "function", "function": {"name": "get_time"}}, ["get_time"]),
        (MESSAGES, MESSAGES_TOOLS, {"type": "any"}, ["get_weather"]),  # a server tool is not the client's
        (MESSAGES, MESSAGES_TOOLS, {"type": "tool", "name": "get_weather"}, ["get_weather"]),
    ],
)
def test_forced_choices(path: str, tools: Any, choice: Any, names: list[str]) -> None:
    found = forced(path, {"tools": tools, "tool_choice": choice})
    assert found is not None and list(found.tools) == names


@pytest.mark.parametrize(
    ("path", "choice"),
    [
        (CHAT, "auto"),
        (CHAT, "none"),
        (CHAT, None),
        (MESSAGES, {"type": "auto"}),
        (MESSAGES, {"type": "none"}),
        (MESSAGES, "required"),  # not an Anthropic choice: the engine answers it in its words
    ],
)
def test_choices_that_force_nothing(path: str, choice: Any) -> None:
    assert forced(path, {"tools": CHAT_TOOLS, "tool_choice": choice}) is None


@pytest.mark.parametrize(
    ("path", "doc", "words"),
    [
        (CHAT, {"tools": CHAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}}, "'x'"),
        (CHAT, {"tools": CHAT_TOOLS, "tool_choice": {"type": "function", "function": {}}}, "function.name"),
        (CHAT, {"tool_choice": "required"}, "declares no tools"),
        (MESSAGES, {"tools": MESSAGES_TOOLS, "tool_choice": {"type": "tool", "name": "web"}}, "'web'"),
        (MESSAGES, {"tools": MESSAGES_TOOLS, "tool_choice": {"type": "tool"}}, "name"),
        (MESSAGES, {"tool_choice": {"type": "any"}}, "declares no tools"),
    ],
)
def test_a_choice_of_no_declared_tool_is_a_bad_request(path: str, doc: Any, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        forced(path, doc)


def test_llama_cpp_gets_the_call_as_its_grammar_and_the_rescue_makes_it_a_call() -> None:
    doc = {"messages": [], "tools": CHAT_TOOLS, "tool_choice": "required"}
    choice = forced(CHAT, doc)
    sent, tools = engine_request(LlamaCppEngine.ignores_forced_tool_choice, CHAT, doc, choice)
    assert (
        sent["tool_choice"] == "none"
        and sent["tools"] == CHAT_TOOLS
        and tools
        == {
            "get_weather": CITY,
            "get_time": {},
        }
    )
    schema = sent["response_format"]["json_schema"]["schema"]
    answer = {"name": "get_weather", "arguments": {"city": "Paris"}}
    jsonschema.validate(answer, schema)
    for wrong in (
        {"name": "get_weather", "arguments": {}},
        {"name": "other", "arguments": {}},
        {"city": "x"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    rescued = rescue('{"name": "get_weather", "arguments": {"city": "Paris"}}', tools)
    assert rescued is not None and [(c.name, c.arguments) for c in rescued.calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_other_engines_and_unforced_requests_go_as_they_are() -> None:
    doc = {"messages": [], "tools": CHAT_TOOLS, "tool_choice": "required"}
    assert engine_request(VllmEngine.ignores_forced_tool_choice, CHAT, doc, forced(CHAT, doc)) == (
        doc,
        {"get_weather": CITY, "get_time": {}},
    )
    auto = {**doc, "tool_choice": "auto"}
    assert engine_request(LlamaCppEngine.ignores_forced_tool_choice, CHAT, auto, None)[0] is auto
    assert Forced({"get_time": {}}).call_schema()["anyOf"][0]["properties"]["arguments"] == {"type": "object"}
