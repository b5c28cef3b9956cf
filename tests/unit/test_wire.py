"""wire.py: the one SSE decoder and the one reader of an error body's message, as every side uses them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from modelrunner.wire import (
    EVENT_END,
    EVENT_ENDS,
    SSEDecoder,
    document_message,
    ends_event,
    error_message,
    event_closed,
    event_document,
    first_event_end,
    last_event_end,
    sse_event,
    sse_events,
    sse_field,
    tail_after,
)

STREAM = (
    b": ping\r\n\r\n"
    b'event: message_start\r\ndata: {"a": 1}\r\n\r\n'
    b"data: line one\ndata:line two\n\n"
    b"data: [DONE]\n\n"
)
EVENTS = [("message_start", b'{"a": 1}'), (None, b"line one\nline two"), (None, b"[DONE]")]


def test_events_are_the_same_however_the_bytes_are_cut() -> None:
    assert sse_events(STREAM) == EVENTS
    for size in (1, 2, 7):
        decoder = SSEDecoder()
        events = []
        for at in range(0, len(STREAM), size):
            events += decoder.feed(STREAM[at : at + size])
        assert events + decoder.end() == EVENTS


def test_an_event_written_is_the_event_read() -> None:
    written = b"".join(sse_event(name, data) for name, data in EVENTS)
    assert sse_events(written) == EVENTS
    assert sse_event("ping", b"{}") == b"event: ping\ndata: {}\n\n"
    assert written.endswith(EVENT_ENDS) and b"data: x\r\n\r\n".endswith(EVENT_ENDS)
    assert not b"data: x\n".endswith(EVENT_ENDS)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 1000])
def test_a_streams_tail_says_where_the_decoder_is_between_events(size: int) -> None:
    """The one event-end rule: whatever the reads, the last TAIL bytes of a stream end an event (and an
    event the daemon adds needs no blank line before it) exactly where the decoder holds nothing, for LF
    streams of events (a comment line is no event); a CRLF stream is never said to end an event where it
    does not."""
    lf = STREAM.replace(b"\r\n", b"\n").removeprefix(b": ping\n\n")
    for stream, exact in ((lf, True), (STREAM, False)):
        decoder, tail = SSEDecoder(), EVENT_END
        for at in range(0, len(stream), size):
            piece = stream[at : at + size]
            decoder.feed(piece)
            tail = tail_after(tail, piece)
            assert ends_event(tail) <= decoder.between_events
            assert not exact or ends_event(tail) == decoder.between_events
            assert event_closed(tail) == (b"" if ends_event(tail) else EVENT_END)
        assert ends_event(tail)


def test_the_last_event_end_of_a_buffer() -> None:
    assert last_event_end(b"data: a\n\ndata: b\r\n\r\ndata: c") == len(b"data: a\n\ndata: b\r\n\r\n")
    assert last_event_end(b"data: a\n") == 0
    assert ends_event(b"data: x\r\n\r\n") and not ends_event(b"data: x\r\n")


def test_the_decoder_says_when_it_holds_nothing_of_an_event() -> None:
    decoder = SSEDecoder()
    assert decoder.between_events
    for piece, between in ((b"event: a\n", False), (b"data: 1", False), (b"\n", False), (b"\n", True)):
        decoder.feed(piece)
        assert decoder.between_events is between, piece


def test_the_end_of_a_stream_completes_its_last_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"last": true}') == []
    assert decoder.end() == [(None, b'{"last": true}')]
    assert sse_events(b"event: done\ndata: x\n") == [("done", b"x")]


def test_a_field_loses_one_space_after_its_colon_and_its_carriage_return() -> None:
    assert sse_field(b"data:  two spaces\r") == (b"data", b" two spaces")
    assert sse_field(b"data:x") == (b"data", b"x")
    assert sse_field(b'{"usage": 1}') == (b'{"usage"', b"1}")  # not a field of ours: the caller passes it


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"error": {"message": "no such model", "type": "not_found_error", "code": 404}}, "no such model"),
        ({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}, "bad"),  # Anthropic
        ({"error": "model 'x' not found"}, "model 'x' not found"),  # Ollama
        ({"message": "engine busy"}, "engine busy"),  # DMR's and llama-server's own
        ({"error": {"message": ""}, "message": "the outer one"}, "the outer one"),
        ({"error": {"code": 500}}, None),
        ([1, 2], None),
    ],
)
def test_the_message_of_each_apis_error_shape(body: object, message: str | None) -> None:
    assert document_message(body) == message
    assert error_message(json.dumps(body).encode()) == (message or json.dumps(body))


def test_a_body_that_is_not_json_is_its_text_cut_short() -> None:
    assert error_message(b"  upstream timed out\n") == "upstream timed out"
    assert error_message(b"x" * 2000) == "x" * 500
    assert error_message(b"\xff\xfe bad bytes") == "\ufffd\ufffd bad bytes"
    assert error_message(b"[" * 100_000) == "[" * 500  # too deep for json: text, not a crash
    assert error_message(b" \n") is None


def test_the_cli_imports_it_alone() -> None:
    """Cheap to import: nothing of the daemon (FastAPI, pydantic) nor another module of ours comes with it."""
    code = "import sys, modelrunner.wire; print(sorted(m for m in sys.modules if m.split('.')[0] in MODS))"
    code = code.replace("MODS", "('fastapi', 'pydantic', 'httpx', 'modelrunner')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['modelrunner', 'modelrunner.wire']"


@pytest.mark.parametrize(
    ("data", "end"),
    [
        (b"data: a\n\ndata: b\n\n", 9),
        (b"data: a\r\n\r\ndata: b", 11),
        (b"data: a\r\n\n", 10),
        (b"data: a\n", 0),
    ],
)
def test_the_first_event_end_is_where_the_decoder_completes_an_event(data: bytes, end: int) -> None:
    assert first_event_end(data) == end
    if end:
        decoder = SSEDecoder()
        assert decoder.feed(data[:end]) and decoder.between_events


def test_an_event_document_is_the_json_object_an_event_carries() -> None:
    assert event_document(b'{"choices": []}') == {"choices": []}
    assert [event_document(p) for p in (b"[DONE]", b"[1]", b"\xff", b"{")] == [None] * 4
