"""`role: "system"` messages inside `messages`, as Claude Code 2.1.197 sends them (beta
`mid-conversation-system-2026-04-07`; tests/golden/claude_code_2_1_197_request.json is its captured first
request): accepted on the Messages routes, and the engine gets them where every chat template takes them
(compat/anthropic.py, `with_system_messages_placed`). Real daemon, the fake engine logging each body."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import golden
from tests.conformance.dmr_daemons import FakeDaemons
from tests.fake_engine import FakeEngine
from tests.inprocess import InProcessDaemon

CLAUDE_CODE = golden.load("claude_code_2_1_197_request")


@pytest.fixture
def recorded(fake_daemons: FakeDaemons, tmp_path: Path) -> tuple[InProcessDaemon, Path]:
    events = tmp_path / "events.jsonl"
    engine = FakeEngine("llama.cpp", env={"FAKE_EVENTS": str(events), "FAKE_BODIES": "1"})
    return fake_daemons.start(engines={"llama.cpp": engine}), events


def engine_bodies(events: Path) -> list[tuple[str, dict[str, Any]]]:
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    return [(e["path"], json.loads(e["body"])) for e in lines if e["event"] == "request"]


def claude_code_request() -> dict[str, Any]:
    body: dict[str, Any] = {**CLAUDE_CODE["body"], "model": "tiny"}
    assert [m["role"] for m in body["messages"]] == ["user", "system"]  # the captured shape
    return body


def test_claude_codes_request_with_a_system_message_is_streamed(
    recorded: tuple[InProcessDaemon, Path],
) -> None:
    daemon, events = recorded
    headers = {"anthropic-beta": CLAUDE_CODE["headers"]["anthropic-beta"]}
    answer = daemon.http(
        "POST", "/anthropic/v1/messages?beta=true", json=claude_code_request(), headers=headers
    )
    assert answer.status_code == 200, answer.text
    assert "event: message_stop" in answer.text
    [(path, body)] = engine_bodies(events)
    assert path == "/v1/messages"
    assert [m["role"] for m in body["messages"]] == ["user"]
    said = body["messages"][0]["content"]
    assert said[:2] == CLAUDE_CODE["body"]["messages"][0]["content"]  # the user's blocks, as they were
    system_text = CLAUDE_CODE["body"]["messages"][1]["content"]
    assert said[2] == {"type": "text", "text": f"<system-reminder>\n{system_text}\n</system-reminder>"}
    assert body["system"] == CLAUDE_CODE["body"]["system"]


def test_count_tokens_counts_the_same_placement(recorded: tuple[InProcessDaemon, Path]) -> None:
    daemon, events = recorded
    request = {k: v for k, v in claude_code_request().items() if k not in ("stream", "max_tokens")}
    answer = daemon.http("POST", "/v1/messages/count_tokens", json=request)
    assert answer.status_code == 200, answer.text
    [(path, body)] = engine_bodies(events)
    assert path == "/v1/messages/count_tokens" and [m["role"] for m in body["messages"]] == ["user"]


def test_a_leading_system_message_joins_the_system_prompt(recorded: tuple[InProcessDaemon, Path]) -> None:
    daemon, events = recorded
    messages = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "hi"}]
    request = {"model": "tiny", "max_tokens": 8, "system": "Be brief.", "messages": messages}
    answer = daemon.http("POST", "/anthropic/v1/messages", json=request)
    assert answer.status_code == 200, answer.text
    assert answer.json()["type"] == "message"
    [(_, body)] = engine_bodies(events)
    assert body["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Answer in French."},
    ]
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_a_system_message_with_an_image_is_an_invalid_request_error(
    recorded: tuple[InProcessDaemon, Path],
) -> None:
    daemon, events = recorded
    image = {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
    messages = [{"role": "user", "content": "hi"}, {"role": "system", "content": [image]}]
    answer = daemon.http(
        "POST", "/anthropic/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": messages}
    )
    assert answer.status_code == 400
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "messages.1.content" in error["error"]["message"]
    assert not events.exists() or engine_bodies(events) == []
