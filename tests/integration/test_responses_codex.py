"""The Responses API as Codex 0.171 speaks it (tests/golden/codex_0_171_request.json, its captured first
request): `include: ["reasoning.encrypted_content"]`, a `namespace` tool group and a hosted `web_search`
are accepted; the engine gets the group's functions under flat names and no hosted tool (named in the
`x-modelrunner-dropped-tools` header), a call of a grouped function comes back with its `namespace`, and
reasoning sent back in `input` reaches the engine again. Real daemon, the fake engine logging each body."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests import golden
from tests.conformance.dmr_daemons import FakeDaemons
from tests.fake_engine import FakeEngine
from tests.inprocess import InProcessDaemon

CODEX = golden.load("codex_0_171_request")
NAMESPACE = "multi_agent_v1"


def start(fake_daemons: FakeDaemons, tmp_path: Path, **script: str) -> tuple[InProcessDaemon, Path]:
    events = tmp_path / "events.jsonl"
    env = {"FAKE_EVENTS": str(events), "FAKE_BODIES": "1", **script}
    return fake_daemons.start(engines={"llama.cpp": FakeEngine("llama.cpp", env=env)}), events


def engine_bodies(events: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    return [json.loads(e["body"]) for e in lines if e["event"] == "request"]


def codex_request(**changes: Any) -> dict[str, Any]:
    return {**CODEX["body"], "model": "tiny", **changes}


def stream_items(daemon: InProcessDaemon, request: dict[str, Any]) -> tuple[dict[str, str], list[Any]]:
    """The answer's headers and the items of its `response.output_item.done` events."""
    answer = daemon.http("POST", "/v1/responses", json=request, headers=CODEX["headers"])
    assert answer.status_code == 200, answer.text
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.completed"
    return dict(answer.headers), [e["item"] for e in events if e["type"] == "response.output_item.done"]


def test_codexs_request_reaches_the_engine_with_function_tools_only(
    fake_daemons: FakeDaemons, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon, events = start(fake_daemons, tmp_path)
    with caplog.at_level(logging.INFO, logger="modelrunner.server.responses_api"):
        headers, _ = stream_items(daemon, codex_request())
    assert headers["x-modelrunner-dropped-tools"] == "web_search"
    assert "tools not available locally, dropped: web_search" in caplog.text
    [body] = engine_bodies(events)
    assert [t["function"]["name"] for t in body["tools"]] == [
        "exec_command",
        f"{NAMESPACE}__spawn_agent",
        f"{NAMESPACE}__wait_agent",
    ]
    assert [m["role"] for m in body["messages"]] == [
        "system",
        "user",
        "user",
    ]  # its developer messages as one
    # a request with only function tools has no such header
    plain = daemon.http("POST", "/v1/responses", json={"model": "tiny", "input": "hi"})
    assert plain.status_code == 200 and "x-modelrunner-dropped-tools" not in plain.headers


def test_a_call_of_a_grouped_function_comes_back_with_its_namespace(
    fake_daemons: FakeDaemons, tmp_path: Path
) -> None:
    daemon, events = start(fake_daemons, tmp_path, FAKE_TOOL_CALL=f"{NAMESPACE}__spawn_agent")
    _, items = stream_items(daemon, codex_request())
    [call] = [item for item in items if item["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("spawn_agent", NAMESPACE)
    # turn 2: the call and its output sent back (store: false), as Codex does; the engine sees its own name
    turn_two = [
        *CODEX["body"]["input"],
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"},
    ]
    _, items = stream_items(daemon, codex_request(input=turn_two))
    assert items[-1]["type"] == "message" and items[-1]["content"][0]["text"] == "found: ok"
    sent = engine_bodies(events)[-1]["messages"]
    assert sent[-2]["tool_calls"][0]["function"]["name"] == f"{NAMESPACE}__spawn_agent"


def test_reasoning_round_trips_opaquely(fake_daemons: FakeDaemons, tmp_path: Path) -> None:
    daemon, events = start(fake_daemons, tmp_path, FAKE_REASONING="the file is notes.txt", FAKE_TEXT="hello")
    _, items = stream_items(daemon, codex_request())
    reasoning, message = items
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"]
    assert "the file is notes.txt" not in reasoning["encrypted_content"]  # opaque to the client
    assert message["type"] == "message"
    follow_up = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and?"}]}
    foreign = {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAB-openai-made-this"}
    turn_two = [*CODEX["body"]["input"], foreign, reasoning, message, follow_up]
    stream_items(daemon, codex_request(input=turn_two))
    sent = engine_bodies(events)[-1]["messages"]
    assert sent[-2]["role"] == "assistant" and sent[-2]["reasoning_content"] == "the file is notes.txt"
    assert sent[-1] == {"role": "user", "content": "and?"}
    assert sum("reasoning_content" in m for m in sent) == 1  # the foreign item gave nothing


@pytest.mark.parametrize("include", [["message.output_text.logprobs"], ["no.such.thing"]])
def test_include_values_not_honoured_are_refused(
    fake_daemons: FakeDaemons, tmp_path: Path, include: list[str]
) -> None:
    daemon, events = start(fake_daemons, tmp_path)
    answer = daemon.http("POST", "/v1/responses", json=codex_request(include=include))
    assert answer.status_code == 400
    assert include[0] in answer.json()["error"]["message"]
    assert not events.exists() or engine_bodies(events) == []
