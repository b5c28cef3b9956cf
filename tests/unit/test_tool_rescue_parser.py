"""Tool calls written as text (compat/tool_rescue.py): every shape, and what is left alone: undeclared names,
arguments their schema refuses, text after the calls; a stream holds back only what may become a call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelrunner.compat.assemble import CHAT, COMPLETIONS, MESSAGES
from modelrunner.compat.tool_rescue import (
    Call,
    ChatStreamRescue,
    Holdback,
    MessageStreamRescue,
    Rescued,
    Tools,
    declared,
    rescue,
    rescue_chat,
    rescue_message,
)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: Tools = {"get_weather": WEATHER, "now": {}}
PARIS = Call("get_weather", {"city": "Paris", "days": 2})


def test_declared_tools_in_openai_and_anthropic_shapes() -> None:
    openai = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]}
    anthropic = {
        "tools": [{"name": "get_weather", "input_schema": WEATHER}, {"type": "web_search", "name": "w"}]
    }
    assert declared(CHAT, openai) == {"get_weather": WEATHER}
    assert declared(MESSAGES, anthropic) == {"get_weather": WEATHER}
    assert declared(COMPLETIONS, openai) is None
    assert declared(CHAT, {**openai, "tool_choice": "none"}) is None
    assert declared(MESSAGES, {**anthropic, "tool_choice": {"type": "none"}}) is None
    assert declared(CHAT, {"tools": []}) is None
    assert declared(CHAT, {"tools": "x"}) is None


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>',
        "<tool_call>\n"  # arguments as their JSON text
        + json.dumps({"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})})
        + "\n</tool_call>",
        '<tool_call>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',  # left open at EOS
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "<function=get_weather><parameter=city>Paris</parameter><parameter=days>2</parameter></function>",
        '  {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n',
    ],
)
def test_every_shape_is_a_call(text: str) -> None:
    assert rescue(text, TOOLS) == Rescued("", [PARIS])


def test_text_before_the_calls_stays_and_several_calls_are_kept_in_order() -> None:
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "now", "arguments": {}}</tool_call>\n'
    )
    assert rescue(text, TOOLS) == Rescued("Let me check.", [PARIS, Call("now", {})])


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Paris.",
        '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>',  # not declared
        '{"name": "delete_all", "arguments": {}}',
        '<tool_call>{"name": "get_weather", "arguments": {"days": 2}}</tool_call>',  # city is required
        '<tool_call>{"name": "get_weather", "arguments": {"city": 3}}</tool_call>',  # not a string
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "x": 1}}</tool_call>',
        "<function=get_weather><parameter=city>Paris</parameter><parameter=days>two</parameter></function>",
        "<function=get_weather><parameter=city>Paris</parameter>stray</function>",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call> and then some prose',
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa</tool_call>',  # not JSON
        '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
        '{"name": "get_weather", "arguments": {"city": "Paris"}} is how you would call it',
        '{"name": "get_weather", "arguments": {"city": "Paris"}, "extra": 1}',
        '<tool_call>{"name": "now", "arguments": {}}</tool_call><tool_call>{"name": "x"}</tool_call>',
    ],
)
def test_what_is_not_only_valid_declared_calls_is_left_alone(text: str) -> None:
    assert rescue(text, TOOLS) is None


def test_a_tool_whose_schema_is_itself_invalid_is_never_called() -> None:
    tools: Tools = {"odd": {"type": "no-such-type"}}
    assert rescue('<tool_call>{"name": "odd", "arguments": {}}</tool_call>', tools) is None


def test_a_chat_answer_gets_tool_calls_in_openai_shape() -> None:
    text = (
        'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'
    )
    doc: dict[str, Any] = {
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]
    }
    assert rescue_chat(doc, TOOLS) == 1
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking."
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 2}


def test_a_chat_answer_that_already_has_calls_or_no_calls_is_unchanged() -> None:
    plain: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": "hello"}}]}
    assert rescue_chat(plain, TOOLS) == 0
    assert plain == {"choices": [{"message": {"role": "assistant", "content": "hello"}}]}
    called = {"choices": [{"message": {"content": '{"name": "now", "arguments": {}}', "tool_calls": [{}]}}]}
    assert rescue_chat(called, TOOLS) == 0


def test_an_anthropic_message_gets_tool_use_blocks() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'
    doc: dict[str, Any] = {
        "content": [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": text}],
        "stop_reason": "end_turn",
    }
    assert rescue_message(doc, TOOLS) == 1
    assert doc["stop_reason"] == "tool_use"
    thinking, use = doc["content"]
    assert thinking["type"] == "thinking"
    assert use["type"] == "tool_use" and use["id"].startswith("toolu_")
    assert (use["name"], use["input"]) == ("get_weather", {"city": "Paris", "days": 2})
    unchanged = {"content": [{"type": "text", "text": "no call"}], "stop_reason": "end_turn"}
    assert rescue_message(unchanged, TOOLS) == 0


def _stream(pieces: list[str]) -> tuple[list[str], str, Rescued | None]:
    holdback = Holdback(TOOLS)
    sent = [holdback.feed(piece) for piece in pieces]
    rest, found = holdback.end()
    return sent, rest, found


def test_a_stream_sends_prose_at_once_and_holds_only_from_a_marker() -> None:
    call = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    sent, rest, found = _stream(["Let me ", "see. <tool", "_call>", call[len("<tool_call>") :]])
    assert sent == ["Let me ", "see. ", "", ""]
    assert found == Rescued("", [Call("now", {})]) and rest == ""


def test_a_partial_prefix_is_released_as_soon_as_it_cannot_be_a_marker() -> None:
    holdback = Holdback(TOOLS)
    assert holdback.feed("a <") == "a "
    assert holdback.feed("func") == ""
    assert holdback.feed("tional") == "<functional"
    assert holdback.end() == ("", None)


def test_a_held_block_that_cannot_be_a_call_goes_out_and_the_rest_passes() -> None:
    holdback = Holdback(TOOLS)
    assert holdback.feed("x <tool_call>") == "x "
    assert (
        holdback.feed('{"name": "delete_all"}</tool_call>') == '<tool_call>{"name": "delete_all"}</tool_call>'
    )
    assert holdback.feed("<tool_call>") == "<tool_call>"
    assert holdback.end() == ("", None)


def test_text_after_a_valid_call_releases_it_as_text() -> None:
    call = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    holdback = Holdback(TOOLS)
    assert holdback.feed(call) == ""
    assert holdback.feed(" then") == call + " then"


def test_a_stream_that_opens_with_json_holds_until_it_is_known() -> None:
    sent, rest, found = _stream(['{"name": "get_weather", ', '"arguments": {"city": "Paris", "days": 2}}'])
    assert sent == ["", ""] and found == Rescued("", [PARIS])
    sent, rest, found = _stream(['{"a": 1}', " is JSON"])
    assert sent == ["", '{"a": 1} is JSON'] and (rest, found) == ("", None)


def test_a_held_text_that_is_not_a_call_comes_back_at_the_end() -> None:
    sent, rest, found = _stream(["see <tool_call>", '{"name": "now", "arguments": {"x": ['])
    assert sent == ["see ", ""] and found is None
    assert rest == '<tool_call>{"name": "now", "arguments": {"x": ['


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_a_chat_stream_gets_its_calls_as_tool_call_deltas() -> None:
    rescue = ChatStreamRescue(TOOLS)
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    out = [chunk for piece in pieces for chunk in rescue.feed(_chunk({"content": piece}))]
    out += rescue.feed(_chunk({}, "stop"))
    sent = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in out)
    assert sent == "Sure. "
    last = out[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls"
    (call,) = last["delta"]["tool_calls"]
    assert call["index"] == 0 and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 2}
    assert rescue.rescued == 1


def test_a_chat_stream_whose_held_text_is_no_call_gets_it_back_before_its_end() -> None:
    rescue = ChatStreamRescue(TOOLS)
    assert rescue.feed(_chunk({"content": "a <tool_call>"})) == [_chunk({"content": "a "})]
    assert rescue.feed(_chunk({"content": "{"})) == []
    assert rescue.feed(_chunk({}, "length")) == [_chunk({"content": "<tool_call>{"}, "length")]
    assert rescue.rescued == 0


def test_a_chat_stream_with_the_engine_s_own_calls_passes_as_it_is() -> None:
    rescue = ChatStreamRescue(TOOLS)
    native = _chunk({"tool_calls": [{"index": 0, "function": {"name": "now", "arguments": "{}"}}]})
    assert rescue.feed(native) == [native]
    text = _chunk({"content": '<tool_call>{"name": "now", "arguments": {}}</tool_call>'}, "tool_calls")
    assert rescue.feed(text) == [text]
    usage = {"choices": [], "usage": {"prompt_tokens": 1}}
    assert rescue.feed(usage) == [usage]


def _events(text: str, *after: dict[str, Any]) -> list[dict[str, Any]]:
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    return [
        {"type": "message_start", "message": {"content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
            for p in pieces
        ),
        {"type": "content_block_stop", "index": 0},
        *after,
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
        {"type": "message_stop"},
    ]


def _fed(rescue: MessageStreamRescue, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [out for event in events for out in rescue.feed(event)]


def test_a_message_stream_gets_tool_use_blocks_after_its_prose() -> None:
    rescue = MessageStreamRescue(TOOLS)
    later = {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'
    out = _fed(rescue, _events(text, later))
    kinds = [(e["type"], e.get("index")) for e in out]
    assert kinds == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),  # the engine's next block moved up
        ("message_delta", None),
        ("message_stop", None),
    ]
    texts = [e["delta"]["text"] for e in out if e["type"] == "content_block_delta" and e["index"] == 0]
    assert "".join(texts) == "Sure. "
    use = out[5]["content_block"]
    assert (use["type"], use["name"], use["input"]) == ("tool_use", "get_weather", {})
    assert json.loads(out[6]["delta"]["partial_json"]) == {"city": "Paris", "days": 2}
    assert out[-2]["delta"]["stop_reason"] == "tool_use"
    assert rescue.rescued == 1


def test_a_message_stream_that_is_only_a_call_has_no_text_block() -> None:
    rescue = MessageStreamRescue(TOOLS)
    out = _fed(rescue, _events('<tool_call>{"name": "now", "arguments": {}}</tool_call>'))
    blocks = [e["content_block"]["type"] for e in out if e["type"] == "content_block_start"]
    assert blocks == ["tool_use"] and out[1]["index"] == 0


def test_a_message_stream_whose_text_is_no_call_is_unchanged_but_for_its_pieces() -> None:
    rescue = MessageStreamRescue(TOOLS)
    text = '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>'
    out = _fed(rescue, _events(text))
    assert "".join(e["delta"]["text"] for e in out if e["type"] == "content_block_delta") == text
    assert [e["type"] for e in out].count("content_block_start") == 1
    assert out[-2]["delta"]["stop_reason"] == "end_turn" and rescue.rescued == 0


def test_a_chat_stream_that_ends_without_a_finish_reason_gets_its_held_text_back() -> None:
    rescue = ChatStreamRescue(TOOLS)
    assert rescue.feed(_chunk({"content": "a <tool_call>{"})) == [_chunk({"content": "a "})]
    assert rescue.end() == [_chunk({"content": "<tool_call>{"})]
    assert rescue.end() == []
