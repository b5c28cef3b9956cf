"""The OpenAI Responses API through the official `openai` client: real daemon, llama-server, tiny GGUF."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests import golden
from tests.daemon import Daemon, error_message
from tests.engines import tiny_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path_factory.mktemp("responses"), llama_server) as running:
        yield running


@pytest.fixture
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


def test_create_retrieve_delete(client: openai.OpenAI) -> None:
    created = client.responses.create(model="tiny", input="hi", max_output_tokens=4, temperature=0)
    assert created.id.startswith("resp_") and created.object == "response" and created.model == "tiny"
    assert created.status in ("completed", "incomplete")
    assert created.usage is not None and created.usage.output_tokens <= 4 and created.usage.input_tokens > 0
    assert [item.type for item in created.output] in (["message"], [])
    assert client.responses.retrieve(created.id).id == created.id
    [item] = client.responses.input_items.list(created.id).data
    assert item.type == "message" and item.role == "user"
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)


def test_chain_with_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="tiny", input="hi", instructions="Be brief.", max_output_tokens=3, temperature=0
    )
    second = client.responses.create(
        model="tiny", input="and more", previous_response_id=first.id, max_output_tokens=3, temperature=0
    )
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the history went to the engine
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [i.type for i in items] == ["message"]  # only this turn's input
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="x", previous_response_id="resp_absent")


def test_stream_matches_the_golden_transcript(client: openai.OpenAI, daemon: Daemon) -> None:
    expected = golden.load("responses_stream")
    request = {k: v for k, v in expected["request"].items() if k != "stream"}
    events = [event.model_dump() for event in client.responses.create(**request, stream=True)]
    assert golden.collapse([e["type"] for e in events]) == expected["sequence"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    golden.assert_keys(final, expected["final_keys"], "response.incomplete")
    assert final["status"] == "incomplete"  # cut by max_output_tokens, as OpenAI ends such a stream
    golden.assert_keys(final["usage"], expected["usage_keys"], "usage")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert final["output"][0]["content"][0]["text"] == text
    assert client.responses.retrieve(final["id"]).output[0].id == final["output"][0]["id"]


@pytest.mark.parametrize(
    "prefix",
    [
        "/responses",
        "/v1/responses",
        "/engines/responses",
        "/engines/v1/responses",
        "/engines/llama.cpp/v1/responses",
    ],
)
def test_every_route_prefix(daemon: Daemon, prefix: str) -> None:
    created = daemon.http("POST", prefix, json={"model": "tiny", "input": "hi", "max_output_tokens": 2})
    assert created.status_code == 200, created.text
    response_id = created.json()["id"]
    assert daemon.http("GET", f"{prefix}/{response_id}").json()["id"] == response_id
    assert daemon.http("GET", f"{prefix}/{response_id}/input_items").json()["object"] == "list"
    assert daemon.http("DELETE", f"{prefix}/{response_id}").json()["deleted"] is True


def test_function_tools_and_outputs_are_translated(client: openai.OpenAI) -> None:
    tools: Any = [
        {
            "type": "function",
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    conversation: Any = [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    answer = client.responses.create(model="tiny", input=conversation, tools=tools, max_output_tokens=2)
    assert answer.status in ("completed", "incomplete")
    items = client.responses.input_items.list(answer.id, order="asc").data
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"include": ["message.output_text.logprobs"]}, "include"),  # honoured ones: test_responses_codex
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"tools": [{"name": "f"}]}, "type"),  # a hosted tool is dropped, not refused: test_responses_codex
        ({"input": 3}, "input"),
    ],
)
def test_refused_parameters(daemon: Daemon, body: dict[str, Any], fragment: str) -> None:
    response = daemon.http("POST", "/v1/responses", json={"model": "tiny", "input": "hi", **body})
    assert response.status_code == 400
    assert fragment in error_message(response)


def test_errors_have_openai_shape(client: openai.OpenAI, daemon: Daemon) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="absent", input="hi")
    for bad in (b"{not json", b"[" * 100_000):
        response = daemon.http("POST", "/v1/responses", content=bad)
        assert response.status_code == 400 and error_message(response)
    response = daemon.http("GET", "/v1/responses/resp_absent")
    assert response.status_code == 404 and error_message(response)
    # greedy, as the golden transcript: random weights sampled may end at once, and a stream that stops
    # on end-of-text is rightly `response.completed` (CI once drew that)
    with httpx.stream(
        "POST",
        daemon.url + "/v1/responses",
        json={"model": "tiny", "input": "hi", "stream": True, "max_output_tokens": 1, "temperature": 0},
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.incomplete"
