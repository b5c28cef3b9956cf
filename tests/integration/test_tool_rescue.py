"""Tool calls an engine wrote as text come back as calls (compat/tool_rescue.py), end to end: the real daemon
with the scripted fake engine answering FAKE_TEXT, driven by the official openai client on chat completions
and Responses, and by the ollama client; the `X-Modelrunner-Tool-Rescue` header and the `/metrics` counter
say it happened, and text that is not a declared, valid call is left alone."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from modelrunner.compat import tool_rescue
from tests.conformance.dmr_daemons import FakeDaemons
from tests.inprocess import InProcessDaemon

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
HI: Any = [{"role": "user", "content": "weather in Paris?"}]
HERMES = 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'
QWEN3_CODER = (
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>"
)
HEADER = "x-modelrunner-tool-rescue"


@pytest.fixture
def start(tmp_path: Path, fake_daemons: FakeDaemons) -> Callable[[str], InProcessDaemon]:
    """Starts a daemon whose engine answers `text`; model `tiny`."""

    def started(text: str) -> InProcessDaemon:
        home = tmp_path / f"home{len(fake_daemons.running)}"
        return fake_daemons.start({"FAKE_TEXT": text}, home=home)

    return started


def rescued(daemon: InProcessDaemon, api: str) -> float:
    text = daemon.http("GET", "/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "modelrunner_tool_calls_rescued_total" and sample.labels == {
                "api": api,
                "model": "tiny",
            }:
                return sample.value
    return 0.0


def client(daemon: InProcessDaemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused", max_retries=0)


def test_a_hermes_call_in_the_text_is_a_chat_tool_call(start: Callable[[str], InProcessDaemon]) -> None:
    daemon = start(HERMES)
    raw = client(daemon).chat.completions.with_raw_response.create(model="tiny", messages=HI, tools=TOOLS)
    assert raw.headers.get(HEADER) == "1"
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    assert rescued(daemon, "openai") == 1
    # an answer that is not assembled from a stream (n > 1 here; any answer of vLLM) is read whole for it
    whole = client(daemon).chat.completions.with_raw_response.create(
        model="tiny", messages=HI, tools=TOOLS, n=2
    )
    assert whole.headers.get(HEADER) == "1"
    whole_calls = whole.parse().choices[0].message.tool_calls or []
    assert [c.function.name if c.type == "function" else c.type for c in whole_calls] == ["get_weather"]
    assert rescued(daemon, "openai") == 2


@pytest.mark.parametrize(
    "tools",
    [
        [{"type": "function", "function": {"name": "other", "parameters": WEATHER}}],  # not declared
        [
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": {**WEATHER, "required": ["x"]}},
            }
        ],
    ],
)
def test_a_call_of_an_undeclared_tool_or_with_invalid_arguments_stays_text(
    start: Callable[[str], InProcessDaemon], tools: Any
) -> None:
    daemon = start(HERMES)
    raw = client(daemon).chat.completions.with_raw_response.create(model="tiny", messages=HI, tools=tools)
    assert HEADER not in raw.headers
    message = raw.parse().choices[0].message
    assert message.content == HERMES and not message.tool_calls
    # without tools nothing is rescued either
    plain = client(daemon).chat.completions.create(model="tiny", messages=HI)
    assert plain.choices[0].message.content == HERMES
    assert rescued(daemon, "openai") == 0


def test_a_qwen3_coder_call_is_a_responses_function_call(start: Callable[[str], InProcessDaemon]) -> None:
    daemon = start(QWEN3_CODER)
    tool: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    raw = client(daemon).responses.with_raw_response.create(model="tiny", input="weather?", tools=[tool])
    assert raw.headers.get(HEADER) == "1"
    calls = [item for item in raw.parse().output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2})
    ]
    assert rescued(daemon, "responses") == 1


def test_a_bare_json_call_is_an_ollama_tool_call(start: Callable[[str], InProcessDaemon]) -> None:
    daemon = start(json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}))
    answer = ollama.Client(host=daemon.url).chat(model="tiny", messages=HI, tools=TOOLS, stream=False)
    (call,) = answer.message.tool_calls or []
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert rescued(daemon, "ollama") == 1


def test_streamed_ollama_and_responses_answers_get_the_calls_and_only_the_prose(
    start: Callable[[str], InProcessDaemon],
) -> None:
    daemon = start(HERMES)  # streamed in pieces of 7 characters, `<tool_call>` cut in two
    parts = list(ollama.Client(host=daemon.url).chat(model="tiny", messages=HI, tools=TOOLS, stream=True))
    assert "".join(part.message.content or "" for part in parts) == "Checking."
    calls = [call for part in parts for call in part.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2})
    ]
    assert rescued(daemon, "ollama") == 1

    tool: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    events = list(client(daemon).responses.create(model="tiny", input="weather?", tools=[tool], stream=True))
    deltas = "".join(getattr(e, "delta", "") for e in events if e.type == "response.output_text.delta")
    assert deltas == "Checking."
    done = events[-1]
    assert done.type == "response.completed"
    output_calls = [item for item in done.response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in output_calls] == [
        ("get_weather", {"city": "Paris", "days": 2})
    ]
    assert rescued(daemon, "responses") == 1


def test_a_call_in_the_text_is_an_anthropic_tool_use(start: Callable[[str], InProcessDaemon]) -> None:
    daemon = start(HERMES)
    messages = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0).messages
    tool: Any = {"name": "get_weather", "input_schema": WEATHER}
    raw = messages.with_raw_response.create(model="tiny", max_tokens=50, messages=HI, tools=[tool])
    assert raw.headers.get(HEADER) == "1"
    message = raw.parse()
    assert message.stop_reason == "tool_use"
    text, use = message.content
    assert text.type == "text" and text.text == "Checking."
    assert use.type == "tool_use" and use.id.startswith("toolu_")
    assert (use.name, use.input) == ("get_weather", {"city": "Paris", "days": 2})
    assert rescued(daemon, "anthropic") == 1


def test_a_streamed_chat_answer_gets_tool_call_deltas_and_only_the_prose(
    start: Callable[[str], InProcessDaemon],
) -> None:
    daemon = start(HERMES)  # streamed in pieces of 7 characters, `<tool_call>` cut in two
    stream = client(daemon).chat.completions.create(model="tiny", messages=HI, tools=TOOLS, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Checking."
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert [(c.function and c.function.name, c.function and c.function.arguments) for c in calls] == [
        ("get_weather", json.dumps({"city": "Paris", "days": 2}))
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert rescued(daemon, "openai") == 1
    # a call of a tool the request did not declare streams as the text it is, whole
    other: Any = [{"type": "function", "function": {"name": "other", "parameters": WEATHER}}]
    stream = client(daemon).chat.completions.create(model="tiny", messages=HI, tools=other, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == HERMES
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert rescued(daemon, "openai") == 1


def test_a_streamed_anthropic_answer_gets_a_tool_use_block(start: Callable[[str], InProcessDaemon]) -> None:
    daemon = start(HERMES)
    messages = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0).messages
    tool: Any = {"name": "get_weather", "input_schema": WEATHER}
    with messages.stream(model="tiny", max_tokens=50, messages=HI, tools=[tool]) as stream:
        texts = [event.text for event in stream if event.type == "text"]
        message = stream.get_final_message()
    assert "".join(texts) == "Checking."
    assert message.stop_reason == "tool_use"
    text, use = message.content
    assert text.type == "text" and text.text == "Checking."
    assert use.type == "tool_use" and (use.name, use.input) == ("get_weather", {"city": "Paris", "days": 2})
    assert rescued(daemon, "anthropic") == 1


@pytest.fixture
def on_the_loop(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each reading of a chat answer for calls ran on the daemon's event loop (the real reading,
    watched: the daemon runs in this process)."""
    seen: list[bool] = []
    real = tool_rescue.rescue_chat

    def watched(doc: dict[str, Any], tools: tool_rescue.Tools) -> int:
        seen.append(asyncio_running())
        return real(doc, tools)

    monkeypatch.setattr(tool_rescue, "rescue_chat", watched)
    return seen


def asyncio_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_a_short_answer_is_read_on_the_loop(
    start: Callable[[str], InProcessDaemon], on_the_loop: list[bool]
) -> None:
    daemon = start(HERMES)
    client(daemon).chat.completions.create(model="tiny", messages=HI, tools=TOOLS, n=2)
    assert on_the_loop == [True]  # a thread's hop would cost more than the reading


def test_the_daemon_answers_while_a_hostile_megabyte_is_read(
    tmp_path: Path, fake_daemons: FakeDaemons, on_the_loop: list[bool]
) -> None:
    """A 1 MB answer of unclosed `<parameter=a>` (issue 36 item 1: 130 KB of them froze the daemon ~50 s)
    comes back as the text it is, read off the event loop, and `GET /version` is answered all the while."""
    hostile = "<function=get_weather>" + "<parameter=a>" * (1024 * 1024 // 13) + "</function>"
    answer = tmp_path / "answer.txt"
    answer.write_text(hostile)
    daemon = fake_daemons.start({"FAKE_TEXT_FILE": str(answer)})
    client(daemon).chat.completions.create(model="tiny", messages=HI)  # the model loaded before the clock
    results: list[Any] = []

    def ask() -> None:  # read whole (n=2), as any answer of vLLM is
        created = client(daemon).chat.completions.with_raw_response.create(
            model="tiny", messages=HI, tools=TOOLS, n=2
        )
        results.append(created)

    asking = threading.Thread(target=ask)
    latencies: list[float] = []
    with httpx.Client(base_url=daemon.url, timeout=10) as poll:
        asking.start()
        while asking.is_alive() or not latencies:
            start = time.monotonic()
            assert poll.get("/version").status_code == 200
            latencies.append(time.monotonic() - start)
    asking.join()
    (raw,) = results
    assert HEADER not in raw.headers
    message = raw.parse().choices[0].message
    assert message.content == hostile and not message.tool_calls
    assert max(latencies) < 2.0, latencies  # generous for a loaded machine: the old reading took hours
    assert on_the_loop == [False]
