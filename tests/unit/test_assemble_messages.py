"""The unstreamed Anthropic message put together from llama-server's stream (compat/assemble.py), including
a stream that does not open with `message_start`: llama-server b11434 skips that event when the first
tokens are an incomplete UTF-8 sequence it holds back (seen with the tiny model's random weights)."""

from __future__ import annotations

import json
from typing import Any

from modelrunner.compat import assemble


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in events)


BODY = (
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "\u0162"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"output_tokens": 2},
    },
    {"type": "message_stop"},
)


def test_a_stream_that_opens_with_message_start_keeps_the_engines_message() -> None:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_engine",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "engine-name",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 7, "output_tokens": 0},
        },
    }
    assembler = assemble.assembler_for(assemble.MESSAGES, "tiny")
    assembler.feed(sse(start, *BODY))
    message = assembler.result()
    assert message["id"] == "msg_engine" and message["model"] == "engine-name"
    assert message["usage"] == {"input_tokens": 7, "output_tokens": 2}
    assert message["content"] == [{"type": "text", "text": "\u0162"}]
    assert message["stop_reason"] == "max_tokens"


def test_a_stream_without_message_start_still_makes_a_whole_message() -> None:
    assembler = assemble.assembler_for(assemble.MESSAGES, "tiny")
    assembler.feed(sse(*BODY))
    message = assembler.result()
    assert message["id"].startswith("msg_") and message["type"] == "message"
    assert message["role"] == "assistant" and message["model"] == "tiny"
    assert message["usage"] == {"input_tokens": 0, "output_tokens": 2}  # the engine never said the input's
    assert message["content"] == [{"type": "text", "text": "\u0162"}]
    assert message["stop_reason"] == "max_tokens" and message["stop_sequence"] is None
