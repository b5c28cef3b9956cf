"""Structured output (compat/structured.py): which schema a request asks for, how the engine is given it,
and how answers, whole or streamed, are checked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelrunner.compat.assemble import CHAT, COMPLETIONS, MESSAGES
from modelrunner.compat.structured import (
    ANY_OBJECT,
    Constraint,
    ConstraintFailed,
    StreamCheck,
    constrained,
    requested_schema,
)
from modelrunner.engines.base import Engine
from modelrunner.engines.diffusers import DiffusersEngine
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.engines.vllm import VllmEngine
from modelrunner.errors import BadRequest

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


def constraint_of(engine: type[Engine]) -> Constraint:
    """SCHEMA's constraint for a request `engine` answers, as server/engine_request.py makes it."""
    return Constraint(SCHEMA, enforced=engine.schema_grammar)


def test_the_schema_each_request_asks_for() -> None:
    assert requested_schema(CHAT, {"response_format": AS_SCHEMA}) == SCHEMA
    assert requested_schema(CHAT, {"response_format": {"type": "json_object"}}) == ANY_OBJECT
    assert requested_schema(COMPLETIONS, {"json_schema": SCHEMA}) == SCHEMA  # llama-server's own field
    assert requested_schema(CHAT, {"response_format": {"type": "text"}}) is None
    assert requested_schema(CHAT, {}) is None
    assert requested_schema(MESSAGES, {"response_format": AS_SCHEMA}) is None


@pytest.mark.parametrize(
    "fmt",
    [
        "json",
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "a"}},
        {"type": "json_schema", "json_schema": {"schema": ["not", "an", "object"]}},
        {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}},
        {"type": "json_object", "schema": {"required": "answer"}},
    ],
)
def test_a_format_that_is_not_a_schema_is_a_bad_request(fmt: Any) -> None:
    with pytest.raises(BadRequest):
        requested_schema(CHAT, {"response_format": fmt})
    assert constrained(json.dumps({"response_format": fmt}).encode())  # served where it is refused


def test_only_bodies_that_ask_are_taken_off_the_byte_relay() -> None:
    assert constrained(json.dumps({"model": "m", "response_format": AS_SCHEMA}).encode())
    assert not constrained(b'{"model": "m", "messages": [{"role": "user", "content": "response_format"}]}')
    assert not constrained(b'{"response_format": ')  # not JSON: answered as such where it is served


def test_the_grammar_reaches_llama_servers_completions_as_its_json_schema_field() -> None:
    constraint = constraint_of(LlamaCppEngine)
    doc = {"prompt": "x", "response_format": AS_SCHEMA}
    assert (
        constraint.engine_request(LlamaCppEngine.completions_json_schema, COMPLETIONS, doc)["json_schema"]
        == SCHEMA
    )
    assert (
        constraint.engine_request(LlamaCppEngine.completions_json_schema, CHAT, doc) is doc
    )  # chat parses response_format
    assert (
        constraint.engine_request(VllmEngine.completions_json_schema, COMPLETIONS, doc) is doc
    )  # vLLM's completions parse it
    grammar = {**doc, "grammar": "root ::= x"}  # llama-server refuses both: the client's stays
    assert constraint.engine_request(LlamaCppEngine.completions_json_schema, COMPLETIONS, grammar) is grammar


def test_enforced_only_where_the_engine_builds_a_grammar() -> None:
    assert constraint_of(LlamaCppEngine).header == (b"x-modelrunner-constraint", b"enforced")
    assert constraint_of(VllmEngine).header[1] == b"enforced"
    assert constraint_of(DiffusersEngine).header[1] == b"validated"


def chat_answer(content: str, **message: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": content, **message}}
    return {"choices": [{**choice, "finish_reason": "stop"}]}


def test_whole_answers_are_checked() -> None:
    constraint = constraint_of(LlamaCppEngine)
    assert constraint.check_answer(chat_answer('{"answer": "yes"}'))
    assert constraint.check_answer({"choices": [{"index": 0, "text": '{"answer": "no"}'}]})
    with pytest.raises(ConstraintFailed, match=r"does not match.*'maybe' is not one of.*answer"):
        constraint.check_answer(chat_answer('{"answer": "maybe"}'))
    with pytest.raises(ConstraintFailed, match="not JSON"):
        constraint.check_answer({"choices": [{"index": 0, "text": '{"ans', "finish_reason": "stop"}]})
    # a tool call is the answer: there is no JSON text to check
    constraint.check_answer(chat_answer("", tool_calls=[{"function": {"name": "f", "arguments": "{}"}}]))


def test_an_answer_cut_by_its_token_limit_is_passed_on_unchecked() -> None:
    """As OpenAI answers it: the client sees `finish_reason: "length"` (the SDKs' LengthFinishReasonError),
    not a 502 it would retry."""
    constraint = constraint_of(LlamaCppEngine)
    assert not constraint.check_answer(
        {"choices": [{"index": 0, "text": '{"ans', "finish_reason": "length"}]}
    )
    cut = {
        "index": 0,
        "message": {"role": "assistant", "content": '{"answer": "may'},
        "finish_reason": "length",
    }
    assert not constraint.check_answer({"choices": [cut]})
    check = StreamCheck(constraint)
    finish = (
        b"data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}).encode()
    )
    assert check.feed(event('{"answer": "ma') + finish + b"\n\ndata: [DONE]\n\n")
    assert check.end() == b"data: [DONE]\n\n"


def event(content: str) -> bytes:
    return (
        b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": content}}]}).encode() + b"\n\n"
    )


def test_a_stream_passes_whole_events_and_holds_its_done_until_checked() -> None:
    check = StreamCheck(constraint_of(LlamaCppEngine))
    first, second = event('{"answer": '), event('"yes"}')
    assert check.feed(first[:7]) == b""  # half an event waits for its end
    assert check.feed(first[7:] + b": ping\n\n") == first + b": ping\n\n"
    assert check.feed(second + b"data: [DONE]\n\n") == second
    assert check.end() == b"data: [DONE]\n\n"


def test_a_stream_whose_text_does_not_validate_fails_at_its_end() -> None:
    check = StreamCheck(constraint_of(LlamaCppEngine))
    data = event('{"answer": "maybe"}') + b"data: [DONE]\n\n"
    assert check.feed(data) == event('{"answer": "maybe"}')
    with pytest.raises(ConstraintFailed, match="does not match"):
        check.end()
