"""What the official SDKs tripped on (issue 22, item 6), each through the SDK itself against an in-process
daemon whose engine is the scripted fake (tests/fake_engine.py): a dying engine, a slow one, one whose
requests are read back from its event file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.conformance.dmr_daemons import FakeDaemons
from tests.inprocess import InProcessDaemon, access_lines

Start = Callable[..., InProcessDaemon]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


@pytest.fixture
def start(fake_daemons: FakeDaemons, events: Path) -> Start:
    """A daemon with the fake engine scripted by `env`, the HTTP front on or off, and models packaged."""

    def starter(env: dict[str, str] | None = None, front: bool = True, models: int = 1) -> InProcessDaemon:
        names = ("tiny", "other", "third")[:models]
        return fake_daemons.start({"FAKE_EVENTS": str(events), **(env or {})}, front=front, models=names)

    return starter


def engine_events(path: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == name]


# -- a cut OpenAI stream ends with OpenAI's error event, which the SDK raises ----------------------------


@pytest.mark.parametrize("front", [True, False])
def test_a_stream_cut_by_a_dead_engine_raises_the_openai_sdks_api_error(start: Start, front: bool) -> None:
    daemon = start(env={"FAKE_CRASH_AFTER": "2"}, front=front)
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    chunks: list[Any] = []
    with pytest.raises(openai.APIError, match="the engine stopped while answering") as raised:
        chunks.extend(client.chat.completions.create(model="tiny", messages=HI, stream=True))  # type: ignore[arg-type]
    assert [c.choices[0].delta.content for c in chunks] == ["t0 ", "t1 "]  # what came before the end
    assert isinstance(raised.value.body, dict) and raised.value.body["type"] == "server_error"
    with pytest.raises(openai.APIError, match="the engine stopped while answering"):
        list(client.completions.create(model="tiny", prompt="once", stream=True))


# -- a client that leaves an unstreamed request: a 499 on every API -----------------------------------


def test_a_client_that_leaves_an_unstreamed_request_is_a_499_on_every_api(start: Start) -> None:
    daemon = start(env={"FAKE_CHUNKS": "400", "FAKE_CHUNK_DELAY": "0.05"})  # 20 s of answer
    leave = 1.0  # seconds the client waits: then it leaves
    requests: dict[str, Callable[[], object]] = {
        "anthropic": lambda: anthropic.Anthropic(
            base_url=daemon.url + "/anthropic", api_key="x", max_retries=0, timeout=leave
        ).messages.create(model="tiny", max_tokens=1000, messages=HI),  # type: ignore[arg-type]
        "ollama": lambda: ollama.Client(host=daemon.url, timeout=leave).chat(model="tiny", messages=HI),
        "responses": lambda: openai.OpenAI(
            base_url=daemon.url + "/v1", api_key="x", max_retries=0, timeout=leave
        ).responses.create(model="tiny", input="hi"),
        "openai": lambda: openai.OpenAI(
            base_url=daemon.url + "/v1", api_key="x", max_retries=0, timeout=leave
        ).chat.completions.create(model="tiny", messages=HI),  # type: ignore[arg-type]
    }
    with access_lines() as lines:
        for api, request in requests.items():
            with pytest.raises((httpx.TimeoutException, openai.APITimeoutError, anthropic.APITimeoutError)):
                request()

            def logged(api: str = api) -> bool:
                return any(f"api={api}" in line and "event=request" in line for line in lines.lines)

            daemon.wait_for(logged, f"the {api} request's access line")
        for api in requests:
            [line] = [line for line in lines.lines if f"api={api}" in line and "event=request" in line]
            assert "status=499" in line and "outcome=client_left" in line, line
    metrics = daemon.http("GET", "/metrics").text
    for api in requests:
        assert f'modelrunner_requests_total{{api="{api}",model="tiny",status_class="4xx"}} 1.0' in metrics
    assert "5xx" not in metrics
    daemon.wait_for(lambda: not any(r["in_use"] for r in daemon.ps()), "the runner released")


# -- Anthropic's model list ----------------------------------------------------------------------------


def test_the_anthropic_sdk_lists_and_retrieves_models_in_anthropics_shape(start: Start) -> None:
    daemon = start(models=3)
    client = anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="x", max_retries=0)
    page = client.models.list(limit=2)
    assert len(page.data) == 2 and page.has_more and page.last_id == page.data[-1].id
    listed = list(client.models.list(limit=2))  # the SDK pages on with after_id
    assert sorted(m.id for m in listed) == sorted(
        m["id"] for m in daemon.http("GET", "/v1/models").json()["data"]
    )
    assert {m.type for m in listed} == {"model"}
    assert {m.display_name for m in listed} == {"tiny", "other", "third"}
    one = client.models.retrieve(listed[0].id)
    assert one.id == listed[0].id and one.created_at == listed[0].created_at
    raw = daemon.http("GET", "/anthropic/v1/models").json()
    assert set(raw) == {"data", "has_more", "first_id", "last_id"} and raw["has_more"] is False
    assert set(raw["data"][0]) == {"type", "id", "display_name", "created_at"}
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.models.retrieve("absent")
    assert missing.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": missing.value.body["error"]["message"]},  # type: ignore[index]
    }
    with pytest.raises(anthropic.BadRequestError):
        client.models.list(after_id="absent")


def test_the_anthropic_sdk_at_the_daemons_root_lists_models_in_anthropics_shape(start: Start) -> None:
    """Claude Code's ANTHROPIC_BASE_URL is the daemon's root: the SDK's `models.list()` asks `/v1/models`
    (DMR's OpenAI alias, no Anthropic route in DMR) and says `anthropic-version`; it gets Anthropic's shape,
    the OpenAI SDK the OpenAI list, both with DMR's IDs (api.go ToOpenAI: the first tag as stored)."""
    daemon = start(models=2)
    client = anthropic.Anthropic(base_url=daemon.url, api_key="x", max_retries=0)
    listed = list(client.models.list())
    assert {m.type for m in listed} == {"model"}
    assert sorted(m.id for m in listed) == ["docker.io/ai/other:latest", "docker.io/ai/tiny:latest"]
    assert {m.display_name for m in listed} == {"tiny", "other"}
    assert client.models.retrieve("tiny").id == "docker.io/ai/tiny:latest"
    openai_client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="x", max_retries=0)
    served = openai_client.models.list()
    assert sorted(m.id for m in served) == ["docker.io/ai/other:latest", "docker.io/ai/tiny:latest"]
    assert {m.object for m in served} == {"model"}
    with pytest.raises(anthropic.BadRequestError):
        client.models.list(limit=0)


# -- Ollama's ps ---------------------------------------------------------------------------------------


def test_ollama_ps_lists_a_model_with_a_chat_and_an_embedding_runner_once(start: Start) -> None:
    daemon = start()
    client = ollama.Client(host=daemon.url)
    client.chat(model="tiny", messages=HI)
    client.embed(model="tiny", input="hi")
    runners = daemon.ps()
    assert sorted(r["mode"] for r in runners) == ["completion", "embedding"]
    [model] = client.ps().models
    assert model.model == "tiny:latest" and model.size == sum(r["memory_estimate"] for r in runners)


# -- Responses: LangChain's empty assistant message before its function calls -----------------------------


def test_an_empty_assistant_message_before_a_function_call_is_not_a_turn(start: Start, events: Path) -> None:
    daemon = start()
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    tools: Any = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    conversation: Any = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": ""},  # as LangChain sends a turn that only called tools
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    client.responses.create(model="tiny", input=conversation, tools=tools)
    [chat] = engine_events(events, "chat")
    assert chat["body"]["messages"] == [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
