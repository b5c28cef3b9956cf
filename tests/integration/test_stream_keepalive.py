"""A stream that waits (its model loading, an engine silent between events) sends its API's keep-alive
every MODEL_RUNNER_STREAM_KEEPALIVE seconds (0.2 here): `event: ping` on Anthropic's Messages, an SSE
comment on Responses; the official SDKs skip them and read the answer. After a head sent early, the
engine's stream may be framed any way (chunked, sized, close-delimited): the client's is chunked, and
`X-Modelrunner-Constraint` is in that head."""

from __future__ import annotations

from collections.abc import Callable

import anthropic
import httpx
import openai
import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from modelrunner.server import keepalive
from modelrunner.wire import sse_events
from tests.conformance.dmr_daemons import FakeDaemons
from tests.inprocess import InProcessDaemon
from tests.waiting import wait_until

Start = Callable[..., InProcessDaemon]
# one question, typed for each SDK it is sent with (a JSON body takes either)
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
HI_ANTHROPIC: list[MessageParam] = [{"role": "user", "content": "hi"}]
LOADING = {"FAKE_START_DELAY": "1.5"}  # the model loads for 1.5 s: several intervals of 0.2 s
PREFILL = {"FAKE_FIRST_CHUNK_DELAY": "1.5", "FAKE_TEXT": "hello there"}  # a head, then 1.5 s of nothing
SILENT = {"FAKE_TEXT": "one two three four", "FAKE_CHUNK_DELAY": "0.6"}  # 0.6 s between its events


@pytest.fixture
def start(fake_daemons: FakeDaemons, monkeypatch: pytest.MonkeyPatch) -> Start:
    monkeypatch.setenv(keepalive.ENV, "0.2")

    def starter(env: dict[str, str], front: bool = True) -> InProcessDaemon:
        # two models: each request of a test loads one
        return fake_daemons.start(env, front=front, models=("tiny", "other"))

    return starter


def _raw(daemon: InProcessDaemon, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(daemon.url + path, json={"model": "tiny", "stream": True, **body}, timeout=60)


@pytest.mark.parametrize("env", [LOADING, SILENT], ids=["loading", "silent-engine"])
def test_anthropic_streams_ping_and_the_sdk_reads_the_answer(start: Start, env: dict[str, str]) -> None:
    daemon = start(env)
    answer = _raw(daemon, "/anthropic/v1/messages", {"max_tokens": 8, "messages": HI})
    assert answer.status_code == 200
    events = sse_events(answer.content)
    assert ("ping", b'{"type": "ping"}') in events
    assert next(name for name, _ in events if name != "ping") == "message_start"
    assert events[-1][0] == "message_stop"

    client = anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)
    with client.messages.stream(model="other", max_tokens=8, messages=HI_ANTHROPIC) as stream:
        text = stream.get_final_text()
    assert text == env.get("FAKE_TEXT", "hi")


def test_responses_stream_comments_and_the_sdk_reads_the_answer(start: Start) -> None:
    daemon = start({**LOADING, "FAKE_TEXT": "hello there"})
    answer = _raw(daemon, "/v1/responses", {"input": "hi"})
    assert answer.status_code == 200
    assert answer.content.startswith(keepalive.SSE_COMMENT)
    assert b"event: response.completed" in answer.content

    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    stream = client.responses.create(model="other", input="hi", stream=True)
    done = [event for event in stream if event.type == "response.completed"]
    assert len(done) == 1 and done[0].response.output_text == "hello there"


@pytest.mark.parametrize("front", [True, False], ids=["http-front", "asgi"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_streams_comment_while_the_model_loads(start: Start, path: str, front: bool) -> None:
    daemon = start({**LOADING, "FAKE_TEXT": "hello there"}, front)
    body: dict[str, object] = {"messages": HI} if path.endswith("chat/completions") else {"prompt": "hi"}
    answer = _raw(daemon, path, body)
    assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
    assert answer.content.startswith(keepalive.SSE_COMMENT)
    assert answer.content.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("native", ["1", "0"], ids=["c-relay", "python-relay"])
def test_a_silent_prefill_after_the_engines_head_is_commented_through(
    start: Start, native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's head alone, then nothing: the C relay takes the body from the head and writes the
    comments (server/native_relay.py); relayed in Python, the front writes them."""
    monkeypatch.setenv("MODEL_RUNNER_NATIVE_RELAY", native)
    daemon = start({**PREFILL, "FAKE_CHUNK_DELAY": "0.4"})
    answer = _raw(daemon, "/v1/chat/completions", {"messages": HI})
    assert answer.status_code == 200
    head, _, rest = answer.content.partition(b"data: ")
    assert head.startswith(keepalive.SSE_COMMENT) and set(head.split(b"\n\n")) == {b": keep-alive", b""}
    assert rest.endswith(b"data: [DONE]\n\n")
    # the first token's time is the engine's first chunk's (1.5 s), not the stream's end (0.4 s a chunk later)
    metrics = _openai_metrics(daemon)
    first_token = metrics["modelrunner_time_to_first_token_seconds_sum"]
    assert 1.4 < first_token < metrics["modelrunner_request_duration_seconds_sum"] - 0.3


@pytest.mark.parametrize("native", ["1", "0"], ids=["c-relay", "python-relay"])
def test_a_stream_whose_head_went_out_while_its_model_loaded_has_its_first_token_timed(
    start: Start, native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early head goes out before the request has a runner, and so before it has a record: the record
    still learns that the answer is a stream (server/lifecycle.py, Exchange.recorded), and its first token
    is timed. Before, a load longer than one keep-alive interval lost it."""
    monkeypatch.setenv("MODEL_RUNNER_NATIVE_RELAY", native)
    daemon = start({**LOADING, "FAKE_TEXT": "hello there"})
    answer = _raw(daemon, "/v1/chat/completions", {"messages": HI})
    assert answer.content.startswith(keepalive.SSE_COMMENT)  # the head went out while the model loaded
    metrics = _openai_metrics(daemon)
    assert metrics["modelrunner_time_to_first_token_seconds_count"] == 1
    first_token = metrics["modelrunner_time_to_first_token_seconds_sum"]
    assert 1.4 < first_token <= metrics["modelrunner_request_duration_seconds_sum"]


def _openai_metrics(daemon: InProcessDaemon) -> dict[str, float]:
    """The daemon's request metrics of the OpenAI family (one model in these tests), once a request is
    counted: that happens as it ends, which may be after its client has the last byte."""

    def scraped() -> dict[str, float]:
        found = {
            sample.name: sample.value
            for family in text_string_to_metric_families(httpx.get(daemon.url + "/metrics").text)
            for sample in family.samples
            if sample.labels.get("api") == "openai"
        }
        return found if found.get("modelrunner_request_duration_seconds_count") else {}

    return wait_until(scraped, "the request's metrics")


@pytest.mark.parametrize("env", [LOADING, PREFILL], ids=["loading", "prefill"])
def test_the_openai_sdk_reads_a_stream_that_commented(start: Start, env: dict[str, str]) -> None:
    daemon = start({**env, "FAKE_TEXT": "hello there"})
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    chunks = client.chat.completions.create(model="other", messages=HI, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello there"


def test_an_unstreamed_request_that_waits_is_answered_whole(start: Start) -> None:
    daemon = start(LOADING)
    answer = httpx.post(
        daemon.url + "/v1/chat/completions", json={"model": "tiny", "messages": HI}, timeout=60
    )
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
    assert answer.json()["choices"][0]["message"]["content"]  # assembled whole, no comment before it


def test_a_stream_that_declares_tools_comments_too(start: Start) -> None:
    """The front hands a stream that declares tools to the ASGI relay (its calls are rescued there)."""
    daemon = start({**LOADING, "FAKE_TOOL_CALL": "search"})
    tools: list[ChatCompletionFunctionToolParam] = [
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
    ]
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    with client.chat.completions.with_streaming_response.create(
        model="tiny",
        messages=HI,
        tools=tools,
        stream=True,
    ) as answer:
        raw = b"".join(answer.iter_bytes())
    assert raw.startswith(keepalive.SSE_COMMENT) and b'"search"' in raw


# -- after an early head: what the head says, and how the engine's stream is framed --------------------

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
JSON_ANSWER = '{"answer": "yes"}'


@pytest.mark.parametrize("front", [True, False], ids=["http-front", "asgi"])
@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
def test_an_engine_stream_of_any_framing_follows_an_early_head(
    start: Start, front: bool, framing: str
) -> None:
    daemon = start({**LOADING, "FAKE_TEXT": "hello there", "FAKE_STREAM_FRAMING": framing}, front)
    with httpx.Client(timeout=60) as http:  # one connection, kept alive where the answer allows it
        for model in ("tiny", "other"):  # each loads: each stream waits
            body = {"model": model, "stream": True, "messages": HI}
            answer = http.post(daemon.url + "/v1/chat/completions", json=body)
            assert answer.status_code == 200 and answer.headers["transfer-encoding"] == "chunked"
            assert answer.content.startswith(keepalive.SSE_COMMENT)
            assert answer.content.endswith(b"data: [DONE]\n\n")
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    chunks = client.chat.completions.create(model="tiny", messages=HI, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello there"


@pytest.mark.parametrize("framing", ["length", "close"])
def test_a_silent_prefill_of_a_stream_not_chunked_is_commented_through(start: Start, framing: str) -> None:
    daemon = start({**PREFILL, "FAKE_STREAM_FRAMING": framing, "FAKE_START_DELAY": "0.5"})
    answer = _raw(daemon, "/v1/chat/completions", {"messages": HI})
    assert answer.status_code == 200 and answer.content.startswith(keepalive.SSE_COMMENT)
    assert answer.content.endswith(b"data: [DONE]\n\n")


def test_a_reframed_stream_cut_after_an_early_head_ends_with_an_error_event(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close-delimited stream ends where the engine closes; one whose engine stalls is cut by the engine
    idle limit: its client's stream ends with the error event, then its last chunk."""
    monkeypatch.setenv("MODEL_RUNNER_ENGINE_IDLE_TIMEOUT", "1")
    daemon = start({**LOADING, "FAKE_STALL_AFTER": "2", "FAKE_STREAM_FRAMING": "close"})
    answer = _raw(daemon, "/v1/chat/completions", {"messages": HI})
    assert answer.status_code == 200 and answer.content.startswith(keepalive.SSE_COMMENT)
    events = [payload for _, payload in sse_events(answer.content)]
    assert b"t1" in events[-2] and b'"error"' in events[-1]


def test_the_constraint_header_is_in_an_early_head(start: Start) -> None:
    daemon = start({**LOADING, "FAKE_TEXT": JSON_ANSWER})
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    answer = _raw(daemon, "/v1/chat/completions", {"messages": HI, "response_format": fmt})
    assert answer.status_code == 200 and answer.content.startswith(keepalive.SSE_COMMENT)
    assert answer.headers["x-modelrunner-constraint"] == "enforced"
    assert answer.content.endswith(b"data: [DONE]\n\n")  # after the answer validated

    text = {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}}
    responses = _raw(daemon, "/v1/responses", {"model": "other", "input": "hi", "text": text})
    assert responses.content.startswith(keepalive.SSE_COMMENT)
    assert responses.headers["x-modelrunner-constraint"] == "enforced"
    assert b"event: response.completed" in responses.content
