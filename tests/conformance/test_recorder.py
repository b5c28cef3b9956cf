"""The request recorder, as DMR's: follows pkg/metrics/openai_recorder.go (and its openai_recorder_test.go),
cmd/cli/commands/requests.go and the desktop client's Requests (cmd/cli/desktop/desktop.go).

Unit tests of the recorder's pieces, then the routes and the `model requests` verb against the daemon
with the scripted engine."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from modelrunner.scheduler.settings import ModelSettings, backend_configuration
from modelrunner.server import recorder as rec
from modelrunner.server.lifecycle import Exchange, Lifecycle
from tests.conformance.dmr_daemons import FakeDaemons
from tests.daemon import runner_env
from tests.inprocess import InProcessDaemon


def letters(n: int) -> str:
    return "".join(chr(ord("A") + i % 26) for i in range(n))


# -- truncateBase64Data / truncateMediaFields ------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("data:image/png;base64,xyz789", "data:image/png;base64,xyz789"),
        (
            "data:image/png;base64," + letters(250),
            "data:image/png;base64," + letters(100) + "...[truncated 150 chars]",
        ),
        (
            "data:text/plain;" + "p" * 120 + ";base64," + letters(40),
            "data:text/plain;" + "p" * 120 + ";base64," + letters(40),
        ),
        (letters(180), letters(100) + "...[truncated 80 chars]"),
        ("short", "short"),
    ],
)
def test_base64_is_cut_to_100_characters(data: str, expected: str) -> None:
    # follows openai_recorder.go truncateBase64Data: the payload of a data URL, or raw base64
    assert rec.truncate_base64(data) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"broken": ', '{"broken": '),  # not JSON: as it was
        # NaN is Python's JSON, not Go's: Go's decoder fails, so the body is kept as it was
        (b'{"model": "m", "messages": [], "t": NaN}', '{"model": "m", "messages": [], "t": NaN}'),
        (b'{"model": "m", "prompt": "p"}', '{"model": "m", "prompt": "p"}'),  # no messages: as it was
        (b'{"model": "m", "messages": {"role": "user"}}', '{"model": "m", "messages": {"role": "user"}}'),
        (b'{"model": "m", "messages": null}', '{"model": "m", "messages": null}'),
        # a messages array: written again as Go writes a decoded map (sorted keys, compact)
        (b'{"model": "m", "messages": []}', '{"messages":[],"model":"m"}'),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "a < b & c"}], "temperature": 1.0}',
            '{"messages":[{"content":"a \\u003c b \\u0026 c","role":"user"}],"model":"m","temperature":1}',
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, '
            b'"odd"]}]}',
            '{"messages":[{"content":[{"text":"hi","type":"text"},"odd"],"role":"user"}],"model":"m"}',
        ),
    ],
)
def test_request_bodies_are_recorded_as_dmr_records_them(body: bytes, expected: str) -> None:
    # follows openai_recorder.go truncateMediaFields and TestTruncateMediaFields
    assert rec.truncate_media(body) == expected


def test_media_in_requests_is_cut() -> None:
    image = "data:image/jpeg;base64," + letters(300)
    audio = letters(250)
    openai_body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image}},
                    {"type": "input_audio", "input_audio": {"data": audio}},
                ],
            }
        ],
    }
    recorded = json.loads(rec.truncate_media(json.dumps(openai_body).encode()))
    parts = recorded["messages"][0]["content"]
    assert parts[0]["image_url"]["url"].endswith(letters(100)[-10:] + "...[truncated 200 chars]")
    assert parts[1]["input_audio"]["data"] == letters(100) + "...[truncated 150 chars]"
    # beyond DMR: the other APIs' media
    ollama = json.loads(
        rec.truncate_media(json.dumps({"model": "m", "prompt": "p", "images": [audio]}).encode())
    )
    assert ollama["images"] == [letters(100) + "...[truncated 150 chars]"]
    source = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": audio}}
    anthropic = json.loads(
        rec.truncate_media(json.dumps({"messages": [{"role": "user", "content": [source]}]}).encode())
    )
    assert anthropic["messages"][0]["content"][0]["source"]["data"].endswith("[truncated 150 chars]")
    responses = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": image}]}]}
    cut = json.loads(rec.truncate_media(json.dumps(responses).encode()))
    assert cut["input"][0]["content"][0]["image_url"].endswith("[truncated 200 chars]")


# -- records ---------------------------------------------------------------------------------------------


def exchange(
    recorder: rec.Recorder, path: str = "/engines/v1/chat/completions", body: bytes = b"{}"
) -> Exchange:
    lifecycle = Lifecycle(None, recorder)  # type: ignore[arg-type]  # no runner is involved here
    ex = Exchange(lifecycle, "POST", path, {b"user-agent": b"tester/1"})
    ex.keep_request(body)
    return ex


def finish(recorder: rec.Recorder, ex: Exchange, status: int, content_type: bytes, *chunks: bytes) -> None:
    assert ex.record is not None
    if status:
        ex.started_answer(status, [(b"content-type", content_type)])
    for chunk in chunks:
        ex.answered(chunk, False)
    recorder.finish(ex.record, ex.access())


def recorded(
    recorder: rec.Recorder, path: str, status: int, content_type: bytes, *chunks: bytes, **kw: Any
) -> dict[str, Any]:
    ex = exchange(recorder, path, kw.get("body", b'{"model": "ai/m"}'))
    settings = kw.get("settings")
    config = backend_configuration(settings) if settings else {}
    ex.record = recorder.start(ex.head, ex.kept_request(), "ai/m", "sha256:" + "1" * 64, config)
    finish(recorder, ex, status, content_type, *chunks)
    [entry] = recorder.listing("sha256:" + "1" * 64)
    return entry["records"][-1]  # type: ignore[no-any-return]


def sse(*docs: Any, done: bool = True) -> bytes:
    events = b"".join(b"data: " + json.dumps(d).encode() + b"\n\n" for d in docs)
    return events + (b"data: [DONE]\n\n" if done else b"")


def test_the_last_ten_records_of_each_model_are_kept_in_dmrs_shape() -> None:
    # follows openai_recorder.go: maximumRecordsPerModel, RequestResponsePair, ModelRecordsResponse
    recorder = rec.Recorder()
    settings = ModelSettings(context_size=4096, runtime_flags=["--threads", "2"], keep_alive=300.0)
    for i in range(12):
        recorded(
            recorder,
            "/engines/v1/chat/completions",
            200,
            b"application/json",
            b'{"n": %d}' % i,
            settings=settings,
        )
    [entry] = recorder.listing(None)
    assert list(entry) == ["count", "model", "config", "records"]
    assert entry["count"] == 10 and entry["model"] == "sha256:" + "1" * 64
    assert entry["config"] == {
        "context-size": 4096,
        "runtime-flags": ["--threads", "2"],
        "keep_alive": "5m0s",
    }
    first = entry["records"][0]
    # DMR's fields in DMR's order, then ours (which Go's decoder skips)
    assert list(first) == [
        "id",
        "model",
        "method",
        "url",
        "request",
        "response",
        "timestamp",
        "status_code",
        "user_agent",
        "request_id",
        "duration_ms",
        "ttfb_ms",
    ]
    assert first["duration_ms"] >= first["ttfb_ms"] >= 0
    assert first["id"].startswith("sha256:" + "1" * 64 + "_") and first["id"].rsplit("_", 1)[1].isdigit()
    assert (
        first["response"] == '{"n": 2}' and first["status_code"] == 200 and first["user_agent"] == "tester/1"
    )
    assert (
        first["model"] == "ai/m"
        and first["method"] == "POST"
        and first["url"] == "/engines/v1/chat/completions"
    )
    assert recorder.listing("sha256:" + "2" * 64) == []


def test_errors_are_recorded_as_json() -> None:
    # follows openai_recorder.go normalizeErrorToJSON and RecordResponse (no status: 408)
    recorder = rec.Recorder()
    record = recorded(recorder, "/engines/v1/chat/completions", 500, b"text/plain", b"engine on fire")
    assert "response" not in record and json.loads(record["error"]) == {"error": "engine on fire"}
    as_json = recorded(
        recorder, "/engines/v1/chat/completions", 404, b"application/json", b'{"error": {"message": "x"}}'
    )
    assert as_json["error"] == '{"error": {"message": "x"}}'
    unanswered = recorded(recorder, "/engines/v1/chat/completions", 0, b"")
    assert unanswered["status_code"] == 408 and unanswered["error"] == '{"error": "unknown error"}'


def test_a_streamed_chat_is_recorded_whole() -> None:
    # follows openai_recorder.go convertStreamingResponse
    top = {"id": "chatcmpl-1", "created": 5, "model": "ai/m", "object": "chat.completion.chunk"}
    body = sse(
        {**top, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {**top, "choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]},
        {**top, "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {**top, "choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {**top, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**top, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    )
    record = recorded(
        recorder := rec.Recorder(),
        "/engines/v1/chat/completions",
        200,
        b"text/event-stream",
        body[:40],
        body[40:],
    )
    answer = json.loads(record["response"])
    assert answer["object"] == "chat.completion" and answer["id"] == "chatcmpl-1"
    assert answer["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hello",
        "reasoning_content": "hm",
    }
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["usage"]["total_tokens"] == 5
    assert recorder.listing(None)[0]["records"][0]["response"] == record["response"]


def test_a_stream_that_failed_is_recorded_as_a_streaming_error() -> None:
    # follows openai_recorder.go StreamingError: status_code, message, type, details
    failed = {"error": {"code": 500, "message": "boom", "type": "server_error"}}
    record = recorded(
        rec.Recorder(), "/v1/chat/completions", 200, b"text/event-stream", sse(failed, done=False)
    )
    error = json.loads(record["error"])
    assert error["status_code"] == 500 and error["message"] == "boom" and error["type"] == "server_error"
    assert json.loads(error["details"]) == failed and "response" not in record


def test_records_are_written_as_go_marshals_them() -> None:
    """openai_recorder.go: records and their parts go through json.Marshal, which escapes <, > and & and
    writes a StreamingError compact, `details` omitted when empty (omitempty); normalizeErrorToJSON wraps a
    text that is not JSON with Sprintf(`{"error": %s}`) around the marshalled text; assembled answers are
    maps (keys sorted)."""
    assert (
        rec.compact_json({"content": "<b> & </b>"})
        == b'{"content":"\\u003cb\\u003e \\u0026 \\u003c/b\\u003e"}'
    )
    assert rec.streaming_error("boom", "") == f'{{"status_code":{rec.STREAM_ERROR_STATUS},"message":"boom"}}'
    assert rec.streaming_error("boom", "x", "server_error", 502) == (
        '{"status_code":502,"message":"boom","type":"server_error","details":"x"}'
    )
    assert rec.normalize_error("a <b>") == '{"error": "a \\u003cb\\u003e"}'
    assert rec.normalize_error('{"x": 1}') == '{"x": 1}'
    stream = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"<hi>"}}]}\n\n'
        b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )
    response, _ = rec.reassemble("openai", "/v1/chat/completions", "text/event-stream", stream)
    assert "\\u003chi\\u003e" in response
    assert response == json.dumps(json.loads(response), sort_keys=True, separators=(",", ":")).replace(
        "<", "\\u003c"
    ).replace(">", "\\u003e")


def test_a_streamed_anthropic_message_is_recorded_whole() -> None:
    # follows openai_recorder.go convertAnthropicStreamingResponse (and its origin, anthropic/messages)
    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "ai/m",
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 3, "output_tokens": 0},
                },
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    body = b"".join(f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in events)
    record = recorded(rec.Recorder(), "/anthropic/v1/messages", 200, b"text/event-stream", body)
    message = json.loads(record["response"])
    assert message["content"] == [{"type": "text", "text": "Hi"}] and message["stop_reason"] == "end_turn"
    assert (
        message["usage"] == {"input_tokens": 3, "output_tokens": 1}
        and record["origin"] == "anthropic/messages"
    )


def test_streams_of_the_other_apis_are_recorded_whole() -> None:
    recorder = rec.Recorder()
    lines = [
        {"model": "m", "message": {"role": "assistant", "content": "Hel"}, "done": False},
        {"model": "m", "message": {"role": "assistant", "content": "lo"}, "done": False},
        {"model": "m", "message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 2},
    ]
    ndjson = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    ollama = recorded(recorder, "/api/chat", 200, b"application/x-ndjson", ndjson)
    merged = json.loads(ollama["response"])
    assert merged["message"]["content"] == "Hello" and merged["done"] and merged["eval_count"] == 2
    assert ollama["origin"] == "ollama/completion"  # DMR's origin of its Ollama completions
    final = {"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": []}}
    stream = (
        b"event: response.created\ndata: {}\n\nevent: response.completed\ndata: "
        + json.dumps(final).encode()
        + b"\n\n"
    )
    responses = recorded(recorder, "/v1/responses", 200, b"text/event-stream", stream)
    assert json.loads(responses["response"]) == final["response"]


def test_records_carry_the_access_lines_timing_and_the_answers_token_counts() -> None:
    """Ours, after DMR's fields: duration_ms and ttfb_ms as the access line has them, prompt_tokens and
    completion_tokens where the answer says them, whichever API it came from."""
    recorder = rec.Recorder()
    ex = exchange(recorder)
    ex.record = recorder.start(ex.head, ex.kept_request(), "ai/m", "sha256:" + "1" * 64, {})
    ex.started_answer(200, [(b"content-type", b"text/event-stream")])
    top = {"id": "c", "created": 5, "model": "ai/m", "object": "chat.completion.chunk"}
    ex.answered(
        sse({**top, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]}), False
    )
    ex.answered(sse({**top, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}), True)
    access = dataclasses.replace(ex.access(), duration_ms=12.5, ttfb_ms=3.25)
    recorder.finish(ex.record, access)
    record = recorder.listing(None)[0]["records"][0]
    assert list(record)[-4:] == ["duration_ms", "ttfb_ms", "prompt_tokens", "completion_tokens"]
    assert (record["duration_ms"], record["ttfb_ms"]) == (12.5, 3.25)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (7, 1)
    assert ex.record.streamed and ex.record.first_data is not None

    failed = exchange(recorder)
    failed.record = recorder.start(failed.head, failed.kept_request(), "ai/m", "sha256:" + "1" * 64, {})
    recorder.finish(failed.record, failed.access())  # nothing answered: no first byte, no tokens
    shown = recorder.listing(None)[0]["records"][-1]
    assert "ttfb_ms" not in shown and "prompt_tokens" not in shown and shown["duration_ms"] >= 0


def anthropic_stream(input_tokens: int, output_tokens: int, text: str = "Hi") -> bytes:
    start = {
        "type": "message_start",
        "message": {"usage": {"input_tokens": input_tokens, "output_tokens": 1}},
    }
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
    end = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": output_tokens},
    }
    events = [("message_start", start), ("content_block_delta", delta), ("message_delta", end)]
    events.append(("message_stop", {"type": "message_stop"}))
    return b"".join(f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in events)


def usage(**counts: int) -> dict[str, Any]:
    return {"usage": counts}


OLLAMA_LINES = [
    {"message": {"content": "a"}, "done": False},
    {"done": True, "prompt_eval_count": 6, "eval_count": 3},
]
RESPONSES_EVENTS = (
    b'event: response.created\ndata: {"response": {"usage": null}}\n\n'
    b"event: response.completed\ndata: "
    + json.dumps({"response": usage(input_tokens=2, output_tokens=5)}).encode()
    + b"\n\n"
)
LLAMA_TIMINGS = {"prompt_n": 4, "cache_n": 50, "predicted_n": 6}


@pytest.mark.parametrize(
    ("answer", "counts"),
    [
        # OpenAI, whole and streamed with usage; llama.cpp's timings in a stream sent without usage
        (json.dumps(usage(prompt_tokens=5, completion_tokens=9)).encode(), (5, 9)),
        (
            sse({"choices": [{"delta": {"content": "x"}}]}, usage(prompt_tokens=5, completion_tokens=2)),
            (5, 2),
        ),
        (sse({"choices": [{"delta": {}, "finish_reason": "length"}], "timings": LLAMA_TIMINGS}), (54, 6)),
        # Anthropic: the prompt's count in message_start, the answer's in message_delta; whole
        (anthropic_stream(11, 4), (11, 4)),
        (json.dumps({"type": "message"} | usage(input_tokens=3, output_tokens=8)).encode(), (3, 8)),
        (json.dumps(usage(input_tokens=1, cache_read_input_tokens=40, output_tokens=2)).encode(), (41, 2)),
        # Ollama, streamed; Responses: the final event holds the response and its usage
        (b"".join(json.dumps(line).encode() + b"\n" for line in OLLAMA_LINES), (6, 3)),
        (RESPONSES_EVENTS, (2, 5)),
        # embeddings: a prompt only; text that mentions "usage" is not a count; nothing at all
        (json.dumps({"data": []} | usage(prompt_tokens=4, total_tokens=4)).encode(), (4, None)),
        (sse({"choices": [{"delta": {"content": 'say "usage": 5'}}]}), (None, None)),
        (b"", (None, None)),
    ],
)
def test_token_counts_are_read_from_each_apis_answer(answer: bytes, counts: tuple[Any, Any]) -> None:
    assert rec.answer_usage(answer) == counts
    framed = b"%x\r\n%b\r\n0\r\n\r\n" % (len(answer), answer) if answer else b""
    assert rec.answer_usage(framed) == counts  # chunk sizes are passed over


def test_an_answer_longer_than_what_is_kept_still_has_its_counts() -> None:
    recorder = rec.Recorder()
    ex = exchange(recorder, "/anthropic/v1/messages")
    ex.record = recorder.start(ex.head, ex.kept_request(), "ai/m", "sha256:" + "1" * 64, {})
    ex.started_answer(200, [(b"content-type", b"text/event-stream")])
    body = anthropic_stream(13, 70_000, text="x" * (rec.RESPONSE_LIMIT + 10))
    for at in range(0, len(body), 4096):
        ex.answered(body[at : at + 4096], False)
    recorder.finish(ex.record, ex.access())
    assert (ex.record.prompt_tokens, ex.record.completion_tokens) == (13, 70_000)
    assert len(ex.record._response) == rec.RESPONSE_LIMIT and not ex.record._tail


def test_bodies_are_bounded() -> None:
    recorder = rec.Recorder()
    ex = exchange(recorder, body=b"x" * (rec.REQUEST_LIMIT + 10))
    ex.record = recorder.start(ex.head, ex.kept_request(), "ai/m", "sha256:" + "1" * 64, {})
    assert ex.record is not None and len(ex.record.request) < rec.REQUEST_LIMIT + 100
    assert ex.record.request.endswith(b"...[truncated 10 bytes]")
    ex.started_answer(200, [(b"content-type", b"application/json")])
    for _ in range(3):
        ex.answered(b"y" * rec.RESPONSE_LIMIT, False)
    assert len(ex.record._response) == rec.RESPONSE_LIMIT


# -- the byte budget ---------------------------------------------------------------------------------------


def model_id(n: int) -> str:
    return f"sha256:{n:064x}"


def record_of(recorder: rec.Recorder, model: int, request: bytes, answer: bytes) -> rec.Record:
    """A streamed chat recorded for model `model`, its request and answer (one content delta) as given."""
    ex = exchange(recorder, body=request)
    ex.record = recorder.start(ex.head, ex.kept_request(), "ai/m", model_id(model), {"context-size": model})
    top = {"id": "c", "created": 5, "model": "ai/m", "object": "chat.completion.chunk"}
    delta = {**top, "choices": [{"index": 0, "delta": {"content": answer.decode()}, "finish_reason": "stop"}]}
    body = sse(delta, {**top, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})
    finish(
        recorder, ex, 200, b"text/event-stream", *(body[at : at + 65536] for at in range(0, len(body), 65536))
    )
    return ex.record


def held(recorder: rec.Recorder) -> int:
    """What the records kept hold, counted afresh."""
    return sum(record.size for records in recorder.models.values() for record in records)


def test_all_records_together_hold_at_most_the_budget_oldest_out_first() -> None:
    budget = 3 * 2**20
    recorder = rec.Recorder(max_bytes=budget)
    made = []
    for i in range(60):  # 30 models, 2 records each, ~250 KB apiece: ~15 MB recorded in all
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": letters(100_000)}]})
        made.append(record_of(recorder, i % 30, body.encode(), letters(150_000).encode()))
        assert held(recorder) == recorder.size <= budget
        if i % 7 == 0:  # shown: its bodies give way to its JSON, counted in their place
            recorder.listing(None)
            assert held(recorder) == recorder.size <= budget
    kept = [record for records in recorder.models.values() for record in records]
    assert 0 < len(kept) < len(made)
    assert set(kept) == set(made[-len(kept) :])  # the newest, whichever model they are of
    assert all(recorder.models.values())  # a model whose records all went is gone from the listing
    listed = recorder.listing(None)
    assert sum(entry["count"] for entry in listed) == len(kept) and held(recorder) <= budget


def test_a_record_larger_than_the_whole_budget_is_not_kept() -> None:
    recorder = rec.Recorder(max_bytes=200_000)
    small = record_of(recorder, 1, b'{"model": "m"}', b"hi")
    record_of(recorder, 2, b'{"model": "m"}', letters(300_000).encode())
    assert list(recorder.models) == [model_id(1)] and list(recorder.models[model_id(1)]) == [small]
    assert recorder.size == small.size


def test_a_request_in_progress_holds_a_bounded_copy() -> None:
    """The first RESPONSE_LIMIT bytes of an answer and at most 2 * TAIL_KEPT of its end, however long."""
    recorder = rec.Recorder()
    ex = exchange(recorder, body=b"x" * (3 * rec.REQUEST_LIMIT))
    ex.record = recorder.start(ex.head, ex.kept_request(), "ai/m", model_id(1), {})
    ex.started_answer(200, [(b"content-type", b"text/event-stream")])
    bound = rec.REQUEST_LIMIT + 100 + rec.RESPONSE_LIMIT + 2 * rec.TAIL_KEPT
    for size in (1000, 65536, 300_000, 17) * 20:  # ~7 MB streamed
        ex.answered(b"y" * size, False)
        assert ex.record.size <= bound and recorder.size == ex.record.size
    recorder.finish(ex.record, ex.access())
    assert recorder.size == ex.record.size <= rec.REQUEST_LIMIT + 100 + rec.RESPONSE_LIMIT


def listing_response(recorder: rec.Recorder, model: str | None = None) -> Any:
    store = SimpleNamespace(get=lambda name: SimpleNamespace(id=name))  # names are IDs here
    router = rec.build_recorder_router(recorder, store)  # type: ignore[arg-type]
    [route] = router.routes
    scope = {"type": "http", "method": "GET", "path": "/engines/requests", "headers": [], "query_string": b""}
    return asyncio.run(route.endpoint(Request(scope), model, ""))  # type: ignore[attr-defined]


async def chunks_of(response: StreamingResponse) -> list[bytes]:
    return [bytes(chunk) async for chunk in response.body_iterator]  # type: ignore[arg-type]


def test_the_listing_is_written_a_record_at_a_time_as_it_was_written_whole() -> None:
    recorder = rec.Recorder()
    for i in range(12):
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "é<" * 20_000}]})
        record_of(recorder, i % 3, body.encode(), letters(50_000 + i).encode())
    ex = exchange(recorder)
    ex.record = recorder.start(ex.head, ex.kept_request(), "ai/m", model_id(1), {})  # one still answered
    # the listing as one body, as the route answered it before: Starlette's JSONResponse of the entries
    whole = JSONResponse(
        [
            {
                "count": len(records),
                "model": key,
                "config": records[-1].config,
                "records": [r.to_json() for r in records],
            }
            for key, records in recorder.models.items()
        ]
    ).body
    response = listing_response(recorder)
    assert isinstance(response, StreamingResponse) and response.media_type == "application/json"
    chunks = asyncio.run(chunks_of(response))
    assert b"".join(chunks) == whole
    largest = max(len(r.shown()) for records in recorder.models.values() for r in records)
    assert len(chunks) > 13 and max(len(chunk) for chunk in chunks) <= largest < len(whole) / 10
    assert asyncio.run(chunks_of(listing_response(recorder, model_id(2)))) == [
        b"[",
        *rec._entry(model_id(2), {"context-size": 2}, list(recorder.models[model_id(2)]), rec.Record.shown),
        b"]",
    ]
    assert asyncio.run(chunks_of(listing_response(rec.Recorder(), None))) == [b"[", b"]"]


# -- the routes and the verb -----------------------------------------------------------------------------


@pytest.fixture
def daemon(fake_daemons: FakeDaemons) -> InProcessDaemon:
    return fake_daemons.start({"FAKE_CHUNKS": "2"}, models=("tiny", "other"))


HI = [{"role": "user", "content": "hi"}]


def test_every_api_is_recorded(daemon: InProcessDaemon) -> None:
    # follows scheduling/http_handler.go: GET /engines/requests, records once a runner serves the request
    assert daemon.http("GET", "/engines/requests").json() == []
    daemon.http("POST", "/v1/chat/completions", json={"model": "tiny", "messages": HI, "stream": True})
    daemon.http(
        "POST",
        "/v1/chat/completions",
        json={"model": "tiny", "messages": HI},
        headers={"origin": "http://localhost"},
    )
    daemon.http("POST", "/api/chat", json={"model": "tiny", "messages": HI})
    daemon.http(
        "POST",
        "/v1/chat/completions",
        json={"model": "tiny", "messages": []},
        headers={"X-Preload-Only": "true"},
    )
    daemon.http(
        "POST", "/v1/chat/completions", json={"model": "absent", "messages": HI}
    )  # no runner: not recorded
    [entry] = daemon.http("GET", "/engines/requests").json()
    tiny = daemon.http("GET", "/models/tiny").json()["id"]
    assert entry["model"] == tiny and entry["count"] == 3
    urls = [r["url"] for r in entry["records"]]
    assert urls == ["/v1/chat/completions", "/v1/chat/completions", "/api/chat"]
    streamed, whole, ollama = entry["records"]
    assert json.loads(streamed["response"])["choices"][0]["message"]["content"] == "t0 t1 "
    assert json.loads(whole["response"])["object"] == "chat.completion"
    assert (
        json.loads(ollama["response"])["message"]["content"] == "t0 t1 "
        and ollama["origin"] == "ollama/completion"
    )
    assert json.loads(streamed["request"]) == {"messages": HI, "model": "tiny", "stream": True}
    assert daemon.http("GET", "/engines/requests", params={"model": "other"}).json() == []
    assert daemon.http("GET", "/engines/requests", params={"model": "tiny"}).json()[0]["count"] == 3
    assert daemon.http("GET", "/engines/requests", params={"model": "nothing/here"}).json() == []


def test_records_are_followed_as_server_sent_events(daemon: InProcessDaemon) -> None:
    # follows openai_recorder.go handleStreamingRequests: existing_request events, connected, new_request
    daemon.http("POST", "/v1/chat/completions", json={"model": "tiny", "messages": HI})
    events: list[tuple[str, Any]] = []
    connected = threading.Event()

    def follow() -> None:
        headers = {"Accept": "text/event-stream"}
        params = {"include_existing": "true", "model": "tiny"}
        with httpx.stream(
            "GET", daemon.url + "/engines/requests", params=params, headers=headers, timeout=30
        ) as r:
            name = ""
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[6:])))
                    if name == "connected":
                        connected.set()
                    if name == "new_request":
                        return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert connected.wait(30)
    daemon.http("POST", "/v1/chat/completions", json={"model": "other", "messages": HI})  # filtered out
    daemon.http("POST", "/api/chat", json={"model": "tiny", "messages": HI, "stream": False})
    thread.join(30)
    assert [name for name, _ in events] == ["existing_request", "connected", "new_request"]
    assert events[1][1] == {"status": "connected"}
    [new] = events[2][1]
    assert new["count"] == 1 and new["model"] == "tiny" and new["records"][0]["url"] == "/api/chat"


def test_the_requests_verb(daemon: InProcessDaemon, tmp_path: Path) -> None:
    # follows cmd/cli/commands/requests.go
    daemon.http("POST", "/v1/chat/completions", json={"model": "tiny", "messages": HI})
    env = {**runner_env(tmp_path / "home", daemon.port)}
    shown = subprocess.run(
        [sys.executable, "-m", "modelrunner", "requests", "--model", "tiny"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)[0]["count"] == 1
    refused = subprocess.run(
        [sys.executable, "-m", "modelrunner", "requests", "--include-existing"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "--include-existing can only be used with --follow" in refused.stderr
    follower = subprocess.Popen(
        [sys.executable, "-m", "modelrunner", "requests", "-f", "--include-existing"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline().strip() == "Connected to request stream. Press Ctrl+C to stop."
        existing = json.loads(follower.stdout.readline())
        assert existing[0]["records"][0]["url"] == "/v1/chat/completions"
        daemon.http("POST", "/v1/responses", json={"model": "tiny", "input": "hi"})
        new = json.loads(follower.stdout.readline())
        assert new[0]["records"][0]["url"] == "/v1/responses"
    finally:
        follower.terminate()
        follower.wait(10)
