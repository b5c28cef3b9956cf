"""Thinking blocks signed on the engine's own Messages route (compat/thinking_signature.py): llama-server
b11434's empty signature replaced, one added where an engine sends none, however the stream's bytes are cut
into reads, and a stream without thinking passed on byte for byte, chunk for chunk."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelrunner.compat import anthropic_chat
from modelrunner.compat.thinking_signature import SignedStream, StreamSigner, signature, signed_body
from modelrunner.wire import ends_event, sse_events

THOUGHT = ["The user ", 'says "hi"', "; answer."]
SIGNED = signature("".join(THOUGHT))


def wire(*docs: dict[str, Any]) -> bytes:
    """Events as llama-server writes them (format_anthropic_sse: compact JSON)."""
    return b"".join(
        b"event: %s\ndata: %s\n\n" % (d["type"].encode(), json.dumps(d, separators=(",", ":")).encode())
        for d in docs
    )


START = {"type": "message_start", "message": {"id": "chatcmpl-1", "content": [], "role": "assistant"}}
STOP: list[dict[str, Any]] = [
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
]


def block_start(index: int, kind: str) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": {"type": kind, kind: ""}}


def delta(index: int, kind: str, value: str) -> dict[str, Any]:
    field = {"thinking_delta": "thinking", "text_delta": "text", "signature_delta": "signature"}[kind]
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind, field: value}}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def llama_server_stream(engine_signature: str | None = "") -> list[bytes]:
    """A thinking block then text, one chunk per result as b11434 streams it: the first with the message's
    and the block's start, the last closing every block, the thinking block first (after an empty
    `signature_delta`), at the message's end."""
    closing = [delta(0, "signature_delta", engine_signature)] if engine_signature is not None else []
    return [
        wire(START, block_start(0, "thinking"), delta(0, "thinking_delta", THOUGHT[0])),
        *(wire(delta(0, "thinking_delta", piece)) for piece in THOUGHT[1:]),
        wire(block_start(1, "text"), delta(1, "text_delta", "Hello")),
        wire(delta(1, "text_delta", " there.")),
        wire(*closing, stop(0), stop(1), *STOP),
    ]


def relayed(chunks: list[bytes]) -> bytes:
    signed = SignedStream()
    out = b"".join(signed.feed(chunk) for chunk in chunks) + signed.end()
    assert ends_event(out)
    return out


def cut(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def docs(data: bytes) -> list[dict[str, Any]]:
    events = sse_events(data)
    assert all(name == json.loads(payload)["type"] for name, payload in events)  # named by their type
    return [json.loads(payload) for _, payload in events]


def expected(chunks: list[bytes]) -> list[dict[str, Any]]:
    """The engine's events with one signature_delta, ours, right before the thinking block stops."""
    out = [d for d in docs(b"".join(chunks)) if d.get("delta", {}).get("type") != "signature_delta"]
    at = out.index(stop(0))
    return [*out[:at], delta(0, "signature_delta", SIGNED), *out[at:]]


@pytest.mark.parametrize(
    "engine_signature",
    ["", "0b7c6f1e9a2d4c3b8e5f6a7b8c9d0e1f", None],
    ids=["empty-replaced", "vllm-uuid-replaced", "absent-added"],
)
def test_the_thinking_block_gets_its_signature_before_it_stops(engine_signature: str | None) -> None:
    chunks = llama_server_stream(engine_signature)
    out = docs(relayed(chunks))
    assert out == expected(chunks)
    completion = {"choices": [{"message": {"reasoning_content": "".join(THOUGHT)}, "finish_reason": "stop"}]}
    assert anthropic_chat.message(completion, "m")["content"][0]["signature"] == SIGNED  # the chat route's
    assert [d["delta"]["signature"] for d in out if d.get("delta", {}).get("type") == "signature_delta"] == [
        SIGNED
    ]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 9, 10, 11, 17, 64, 200])
def test_reads_that_cut_events_and_the_mark_anywhere_give_the_same_events(size: int) -> None:
    chunks = llama_server_stream()
    assert docs(relayed(cut(b"".join(chunks), size))) == expected(chunks)


def test_every_split_in_two_gives_the_same_events() -> None:
    chunks = llama_server_stream()
    whole = b"".join(chunks)
    for at in range(len(whole) + 1):
        assert docs(relayed([whole[:at], whole[at:]])) == expected(chunks), at


def test_what_went_out_before_the_thinking_is_untouched() -> None:
    """The bytes of the event that shows the mark, already passed on in part, are not sent twice."""
    chunks = llama_server_stream()
    whole = b"".join(chunks)
    at = whole.index(b'"thinking"') - 5  # inside the block's start, before the mark
    out = relayed([whole[:at], whole[at:]])
    assert out.startswith(whole[: whole.index(b"event: content_block_delta")])


def test_a_stream_without_thinking_passes_chunk_for_chunk() -> None:
    text = [wire(START, block_start(0, "text"), delta(0, "text_delta", 'about "thinking" and <think>'))]
    text += [wire(stop(0), *STOP)]
    for chunks in (text, cut(b"".join(text), 7), cut(b"".join(text), 1)):
        signed = SignedStream()
        for chunk in chunks:
            assert signed.feed(chunk) is chunk
        assert signed.end() == b""


def test_chunks_after_the_thinking_stopped_pass_as_they_came() -> None:
    """vLLM's order: the thinking block stops before the text starts; parsing ends with it."""
    thinking = wire(START, block_start(0, "thinking"), delta(0, "thinking_delta", "hm"), stop(0))
    signed = SignedStream()
    assert docs(signed.feed(thinking))[-2:] == [
        {**delta(0, "signature_delta", signature("hm"))},
        stop(0),
    ]
    for chunk in (wire(block_start(1, "text")), wire(delta(1, "text_delta", "Hi")), wire(stop(1), *STOP)):
        assert signed.feed(chunk) is chunk


def test_two_thinking_blocks_are_signed_each_by_its_own_text() -> None:
    signer = StreamSigner()
    events = [block_start(0, "thinking"), delta(0, "thinking_delta", "a"), block_start(2, "thinking")]
    events += [delta(2, "thinking_delta", "b"), stop(2), stop(0)]
    out = []
    for event in events:
        instead = signer.feed(event)
        out += [event] if instead is None else instead
    assert out[-4:] == [
        delta(2, "signature_delta", signature("b")),
        stop(2),
        delta(0, "signature_delta", signature("a")),
        stop(0),
    ]


def test_an_unstreamed_message_has_its_thinking_signed() -> None:
    message = {
        "type": "message",
        "content": [
            {"type": "thinking", "thinking": "".join(THOUGHT), "signature": ""},
            {"type": "text", "text": "Hello"},
        ],
    }
    body = json.loads(signed_body(json.dumps(message).encode()))
    assert body["content"][0]["signature"] == SIGNED
    assert body["content"][1] == message["content"][1]
    plain = json.dumps({"type": "message", "content": [{"type": "text", "text": "no reasoning"}]}).encode()
    assert signed_body(plain) is plain
    assert signed_body(b'{"error": "x"} "thinking"') == b'{"error": "x"} "thinking"'  # not JSON: as it is
