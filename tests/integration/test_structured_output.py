"""Structured output is never silently ignored (issue 22 item 5): OpenAI `response_format`, Responses
`text.format` and Ollama `format` reach llama-server's grammar (the tiny random-weight model obeys it, so
its answers validate), and an engine that answers other JSON (the fake engine's FAKE_TEXT) gets the
client an error in its API's shape, at the end of a stream too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import jsonschema
import ollama
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseTextConfigParam
from openai.types.shared_params import ResponseFormatJSONSchema

from modelrunner.wire import sse_events
from tests.conformance.dmr_daemons import fake_daemons_under
from tests.daemon import Daemon, json_lines
from tests.engines import tiny_daemon
from tests.inprocess import InProcessDaemon

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
AS_SCHEMA: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": SCHEMA},
}
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "yes or no?"}]
HEADER = "x-modelrunner-constraint"


def sse_payloads(body: bytes) -> list[str]:
    return [payload.decode() for _, payload in sse_events(body)]


ROOM = 64  # tokens enough for the grammar's whole answer (it then allows only the end)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path_factory.mktemp("structured"), llama_server) as running:
        yield running


@pytest.fixture
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused", max_retries=0)


def test_openai_chat_json_schema_is_enforced(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=HI,
        max_tokens=ROOM,
        response_format=AS_SCHEMA,
    )
    assert raw.headers[HEADER] == "enforced"
    content = raw.parse().choices[0].message.content
    jsonschema.validate(json.loads(content or ""), SCHEMA)


def test_openai_chat_stream_json_schema_is_enforced(client: openai.OpenAI) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="tiny",
        messages=HI,
        max_tokens=ROOM,
        stream=True,
        response_format=AS_SCHEMA,
    ) as raw:
        assert raw.headers[HEADER] == "enforced"
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_completions_reach_llama_servers_grammar_too(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt="yes or no?", max_tokens=ROOM, extra_body={"response_format": AS_SCHEMA}
    )
    assert raw.headers[HEADER] == "enforced"
    jsonschema.validate(json.loads(raw.parse().choices[0].text), SCHEMA)


def test_responses_text_format_is_enforced(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    text: ResponseTextConfigParam = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}
    raw = client.responses.with_raw_response.create(
        model="tiny", input="yes or no?", max_output_tokens=ROOM, text=text
    )
    assert raw.headers[HEADER] == "enforced"
    jsonschema.validate(json.loads(raw.parse().output_text), SCHEMA)


def test_ollama_format_is_enforced(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.url)
    chat = client.chat(model="tiny", messages=HI, format=SCHEMA, options={"num_predict": ROOM})
    jsonschema.validate(json.loads(chat.message.content or ""), SCHEMA)
    # a raw prompt is a plain completion: llama-server takes its grammar as `json_schema`
    streamed = client.generate(
        model="tiny", prompt="yes?", raw=True, format=SCHEMA, stream=True, options={"num_predict": ROOM}
    )
    parts = []
    for part in streamed:
        assert part.response is not None
        parts.append(part.response)
    jsonschema.validate(json.loads("".join(parts)), SCHEMA)
    body = {
        "model": "tiny",
        "prompt": "yes?",
        "format": SCHEMA,
        "stream": False,
        "options": {"num_predict": ROOM},
    }
    assert daemon.http("POST", "/api/generate", json=body).headers[HEADER] == "enforced"


# -- an engine that answers other JSON -----------------------------------------------------------------

WRONG = '{"answer": "maybe"}'


@pytest.fixture(scope="module")
def wrong(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    with fake_daemons_under(tmp_path_factory.mktemp("structured-wrong")) as daemons:
        yield daemons.start({"FAKE_TEXT": WRONG})


def assert_says_it(message: str) -> None:
    assert "does not match the requested JSON schema" in message and "'maybe' is not one of" in message, (
        message
    )


def test_openai_chat_that_does_not_validate_is_an_error(wrong: InProcessDaemon) -> None:
    client = openai.OpenAI(base_url=wrong.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="tiny", messages=HI, response_format=AS_SCHEMA)
    assert caught.value.status_code == 502 and caught.value.response.headers[HEADER] == "enforced"
    assert_says_it(caught.value.message)


def test_openai_stream_that_does_not_validate_ends_with_the_error(wrong: InProcessDaemon) -> None:
    body = {"model": "tiny", "messages": HI, "stream": True, "response_format": AS_SCHEMA}
    response = wrong.http("POST", "/v1/chat/completions", json=body)
    assert response.status_code == 200 and response.headers[HEADER] == "enforced"
    payloads = sse_payloads(response.content)
    assert "[DONE]" not in payloads  # the stream is not ended as if its answer were good
    text = "".join(
        c["choices"][0]["delta"].get("content", "") for c in map(json.loads, payloads[:-1]) if c["choices"]
    )
    assert text == WRONG
    assert_says_it(json.dumps(json.loads(payloads[-1])))


def test_responses_that_does_not_validate_is_an_error(wrong: InProcessDaemon) -> None:
    text = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}
    response = wrong.http("POST", "/v1/responses", json={"model": "tiny", "input": "hi", "text": text})
    assert response.status_code == 502 and response.headers[HEADER] == "enforced"
    assert_says_it(response.json()["error"]["message"])
    streamed = wrong.http(
        "POST", "/v1/responses", json={"model": "tiny", "input": "hi", "text": text, "stream": True}
    )
    last = json.loads(sse_payloads(streamed.content)[-1])
    assert last["type"] == "response.failed"
    assert_says_it(last["response"]["error"]["message"])


def test_ollama_that_does_not_validate_is_an_error(wrong: InProcessDaemon) -> None:
    body = {"model": "tiny", "messages": HI, "format": SCHEMA, "stream": False}
    response = wrong.http("POST", "/api/chat", json=body)
    assert response.status_code == 502 and response.headers[HEADER] == "enforced"
    assert_says_it(response.json()["error"])
    lines = json_lines(wrong.http("POST", "/api/chat", json={**body, "stream": True}).text)
    assert_says_it(lines[-1]["error"])
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=wrong.url).chat(model="tiny", messages=HI, format=SCHEMA, stream=False)
    assert caught.value.status_code == 502
    assert_says_it(caught.value.error)


def test_a_runner_is_left_for_the_next_request(wrong: InProcessDaemon) -> None:
    """Each failed check released its runner: a plain request is answered as ever."""
    response = wrong.http("POST", "/v1/chat/completions", json={"model": "tiny", "messages": HI})
    assert response.status_code == 200 and HEADER not in response.headers
    assert response.json()["choices"][0]["message"]["content"] == WRONG


# -- an answer cut by its token limit (issue 37) ---------------------------------------------------------

CUT = 3  # tokens: `{"answer` and no more


class Answer(pydantic.BaseModel):
    answer: Literal["yes", "no"]


def test_openai_parse_raises_the_sdk_s_length_error(daemon: Daemon) -> None:
    """As OpenAI answers it: the cut JSON comes back with `finish_reason: "length"` (its head saying it was
    not validated), so `parse()` raises the SDK's own LengthFinishReasonError after one request; a 502 was
    retried (three full-length requests) and raised a generic server error."""
    sent: list[object] = []
    counting = openai.DefaultHttpxClient(event_hooks={"request": [sent.append]})
    client = openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused", http_client=counting)
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model="tiny", messages=HI, max_tokens=CUT, response_format=Answer)
    assert len(sent) == 1  # not retried
    with (
        client.chat.completions.stream(
            model="tiny", messages=HI, max_tokens=CUT, response_format=Answer
        ) as stream,
        pytest.raises(openai.LengthFinishReasonError),
    ):
        for _ in stream:
            pass
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=HI, max_tokens=CUT, response_format={"type": "json_object"}
    )
    assert raw.headers[HEADER] == "unvalidated"
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "length"


def test_responses_and_ollama_answers_cut_by_their_limit_are_answered(daemon: Daemon) -> None:
    text = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}
    body = {"model": "tiny", "input": "hi", "text": text, "max_output_tokens": CUT}
    response = daemon.http("POST", "/v1/responses", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["status"] == "incomplete"
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response.headers[HEADER] == "unvalidated"
    chat = ollama.Client(host=daemon.url).chat(  # greedy: sampled, the grammar's free whitespace may be all
        model="tiny", messages=HI, format=SCHEMA, options={"num_predict": CUT, "temperature": 0}
    )
    assert chat.done_reason == "length" and chat.message.content
    streamed = list(
        ollama.Client(host=daemon.url).chat(
            model="tiny", messages=HI, format=SCHEMA, stream=True, options={"num_predict": CUT}
        )
    )
    assert streamed[-1].done_reason == "length"
