"""Anthropic request checks, error bodies, and the repairs of the relayed event stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from modelrunner.compat import anthropic as shapes
from modelrunner.errors import BadRequest
from modelrunner.server.anthropic_serving import Opening, relay_events


def test_error_types_follow_the_status() -> None:
    assert shapes.error_body(404, "gone") == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "gone"},
    }
    assert shapes.error_type(400) == "invalid_request_error"
    assert shapes.error_type(503) == "overloaded_error"
    assert shapes.error_type(412) == "invalid_request_error"
    assert shapes.error_type(502) == "api_error"


def test_requests_are_checked() -> None:
    good = {
        "model": "m",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
    }
    assert shapes.check_request(good, count_tokens=False).model == "m"
    assert (
        shapes.check_request({"model": "m", "messages": [], "system": "s"}, count_tokens=True).system == "s"
    )
    for bad in (
        {"max_tokens": 3, "messages": []},
        {"model": "m", "max_tokens": 3},
        {"model": "m", "max_tokens": 0, "messages": []},
        {"model": "m", "messages": [{"role": "system", "content": "x"}]},
        {"model": "m", "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
    ):
        with pytest.raises(BadRequest):
            shapes.check_request(bad, count_tokens=False)


def reminder(text: str) -> str:
    return f"<system-reminder>\n{text}\n</system-reminder>"


def test_leading_system_messages_join_the_system_prompt() -> None:
    doc = {
        "model": "m",
        "system": "Be brief.",
        "messages": [
            {"role": "system", "content": "Rule one."},
            {
                "role": "system",
                "content": [{"type": "text", "text": "Rule two.", "cache_control": {"type": "ephemeral"}}],
            },
            {"role": "user", "content": "hi"},
        ],
    }
    placed = shapes.with_system_messages_placed(doc)
    assert placed["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Rule one."},
        {"type": "text", "text": "Rule two.", "cache_control": {"type": "ephemeral"}},
    ]
    assert placed["messages"] == [{"role": "user", "content": "hi"}]
    assert shapes.check_request({**placed, "max_tokens": 4}, count_tokens=False).model == "m"
    assert shapes.with_system_messages_placed({**doc, "system": None})["system"][0]["text"] == "Rule one."


def test_a_system_message_after_the_users_joins_that_user_turn_as_a_reminder() -> None:
    """Claude Code 2.1.197's shape: a system message after the last user message (captured)."""
    user = {"role": "user", "content": [{"type": "text", "text": "read notes.txt"}]}
    doc = {"model": "m", "system": "S", "messages": [user, {"role": "system", "content": "Agent types: ..."}]}
    placed = shapes.with_system_messages_placed(doc)
    assert placed["system"] == "S"  # untouched: nothing came before the conversation
    assert placed["messages"] == [
        {
            "role": "user",
            "content": [user["content"][0], {"type": "text", "text": reminder("Agent types: ...")}],
        }
    ]
    # the next turn, with the same system message in the same place, renders the same first turn
    turn_two = [
        *doc["messages"],
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "hello"}]},
    ]
    placed_two = shapes.with_system_messages_placed({**doc, "messages": turn_two})
    assert placed_two["messages"][0] == placed["messages"][0]
    assert placed_two["messages"][1:] == turn_two[2:]


def test_a_system_message_after_an_assistant_goes_behind_the_next_tool_results() -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "hello"}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {"role": "system", "content": [{"type": "text", "text": "File changed."}]},
        {"role": "user", "content": [result, {"type": "text", "text": "go on"}]},
    ]
    placed = shapes.with_system_messages_placed({"model": "m", "messages": messages})
    assert placed["messages"][2]["content"] == [
        result,
        {"type": "text", "text": reminder("File changed.")},
        {"type": "text", "text": "go on"},
    ]
    assert [m["role"] for m in placed["messages"]] == ["user", "assistant", "user"]
    # with no user message beside it, one of its own (roles still alternate)
    alone = shapes.with_system_messages_placed({"model": "m", "messages": messages[:3]})
    assert alone["messages"][2] == {
        "role": "user",
        "content": [{"type": "text", "text": reminder("File changed.")}],
    }


def test_requests_without_system_messages_are_left_as_they_are() -> None:
    doc = {"model": "m", "system": "S", "messages": [{"role": "user", "content": "hi"}]}
    assert shapes.with_system_messages_placed(doc) is doc
    malformed = {"model": "m", "messages": "not a list"}
    assert shapes.with_system_messages_placed(malformed) is malformed


@pytest.mark.parametrize("content", [[{"type": "image", "source": {}}], 7, [{"type": "text"}]])
def test_a_system_message_holds_only_text(content: object) -> None:
    doc = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": content}],
    }
    with pytest.raises(BadRequest, match=r"messages\.1\.content"):
        shapes.with_system_messages_placed(doc)


class _RecordedCall:
    """The body of an engine's answer, as the relay reads it (a ServedCall's, and its engine's chunks)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks
        self.closed = False
        self.asked: list[tuple[str, dict[str, Any]]] = []  # requests beside it: counts of the prompt
        self.engine = self  # the call's bytes: these stand-ins are both

    async def beside(self, path: str, body: bytes) -> bytes | None:
        self.asked.append((path, json.loads(body)))
        return b'{"input_tokens": 7}'

    async def _iterate(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk

    def chunks(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def close(self) -> None:
        self.closed = True


BILLING = "x-anthropic-billing-header: cc_version=2.1.177.a3f; cch=1b2c3;"
REQUEST = {"model": "tiny", "max_tokens": 4, "stream": True, "system": BILLING, "messages": []}


def relayed(chunks: list[bytes], call: _RecordedCall | None = None) -> list[dict[str, Any]]:
    call = call or _RecordedCall(chunks)
    opening = Opening(call, "tiny", REQUEST)  # type: ignore[arg-type]

    async def collect() -> bytes:
        return b"".join([c async for c in relay_events(call, opening)])  # type: ignore[arg-type]

    text = asyncio.run(collect()).decode()
    assert call.closed
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


START = b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1"}}\n\n'
# What llama-server b11434 sent when its first tokens were an incomplete UTF-8 sequence: no message_start.
WITHOUT_START = [
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n',
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},'
    b'"usage":{"output_tokens":4}}\n\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


def test_the_model_list_pages_as_anthropics_newest_first() -> None:
    models = [shapes.model_object(f"docker.io/ai/m{i}:latest", 1000 + i) for i in range(5)]
    assert models[0] == {
        "type": "model",
        "id": "docker.io/ai/m0:latest",
        "display_name": "m0",
        "created_at": "1970-01-01T00:16:40Z",
    }
    ids = [f"docker.io/ai/m{i}:latest" for i in (4, 3, 2, 1, 0)]
    first = shapes.model_page(models, 2, None, None)
    assert [m["id"] for m in first["data"]] == ids[:2] and first["has_more"]
    assert (first["first_id"], first["last_id"]) == (ids[0], ids[1])
    last = shapes.model_page(models, 2, ids[3], None)
    assert [m["id"] for m in last["data"]] == ids[4:] and not last["has_more"]
    before = shapes.model_page(models, 2, None, ids[3])
    assert [m["id"] for m in before["data"]] == ids[1:3] and before["has_more"]
    assert not shapes.model_page(models, 5, None, ids[3])["has_more"]
    assert shapes.model_page([], 20, None, None) == {
        "data": [],
        "has_more": False,
        "first_id": None,
        "last_id": None,
    }
    with pytest.raises(BadRequest, match="after_id"):
        shapes.model_page(models, 2, "absent", None)


def test_a_stream_without_message_start_gets_one_with_the_prompts_tokens() -> None:
    call = _RecordedCall(WITHOUT_START)
    events = relayed(WITHOUT_START, call)
    assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
    message = events[0]["message"]
    assert message["model"] == "tiny" and message["role"] == "assistant" and message["id"].startswith("msg_")
    assert message["content"] == [] and message["usage"] == {"input_tokens": 7, "output_tokens": 0}
    # counted as the engine got the request: without Claude Code's billing line (compat/billing.py)
    assert call.asked == [("/v1/messages/count_tokens", {k: v for k, v in REQUEST.items() if k != "system"})]


def test_a_stream_with_message_start_is_passed_on_unchanged_however_it_is_cut() -> None:
    whole = START + b"".join(WITHOUT_START)
    for pieces in ([whole], [whole[:5], whole[5:30], whole[30:]], [bytes([b]) for b in whole]):
        call = _RecordedCall(pieces)
        events = relayed(pieces, call)
        assert not call.asked  # the engine's own message_start counts its prompt
        assert [e["type"] for e in events].count("message_start") == 1 and events[0]["message"][
            "id"
        ] == "msg_1"
