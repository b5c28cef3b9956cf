"""The interactive turn first (scheduler/conversations.py, issue 39): a side request (no tools: an agent's
title or summary) sent while an agent's main turn (with tools) is in flight reaches the engine only after
that turn's answer is complete, on every API family that can carry it; a second interactive turn does not
wait. The engine is the scripted one as llama.cpp, its prefill 1 s of silence; its event file says in which
order requests arrived and answers ended."""

from __future__ import annotations

import concurrent.futures
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.dmr_daemons import FakeDaemons
from tests.inprocess import InProcessDaemon
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
MAIN = {"model": "tiny", "messages": HI, "tools": TOOLS, "stream": True}
SIDES: dict[str, tuple[str, dict[str, Any]]] = {
    "openai": ("/v1/chat/completions", {"model": "tiny", "messages": HI}),
    "anthropic": ("/anthropic/v1/messages", {"model": "tiny", "messages": HI, "max_tokens": 8}),
    "ollama": ("/api/chat", {"model": "tiny", "messages": HI, "stream": False}),
}


def order(events: Path) -> list[str]:
    names = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    return [name for name in names if name in ("request", "completed")]


@pytest.fixture
def daemon(fake_daemons: FakeDaemons, tmp_path: Path) -> InProcessDaemon:
    running = fake_daemons.start(
        {"FAKE_EVENTS": str(tmp_path / "events"), "FAKE_FIRST_CHUNK_DELAY": "1", "FAKE_TEXT": "ok"}
    )
    assert (
        running.http("POST", "/v1/chat/completions", json={"model": "tiny", "messages": HI}).status_code
        == 200
    )
    return running


@pytest.mark.parametrize("api", SIDES)
def test_a_side_request_reaches_the_engine_after_the_interactive_turn(
    daemon: InProcessDaemon, tmp_path: Path, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    events = tmp_path / "events"
    loaded = len(order(events))
    with (
        caplog.at_level(logging.INFO, logger="modelrunner.server.engine_request"),
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        main = pool.submit(daemon.http, "POST", "/v1/chat/completions", json=MAIN)
        wait_until(lambda: len(order(events)) > loaded, "the main turn to reach the engine")
        path, body = SIDES[api]
        assert daemon.http("POST", path, json=body).status_code == 200
        assert main.result().status_code == 200
    assert order(events)[loaded:][:3] == ["request", "completed", "request"]  # the side after the main
    assert "side_request_waited" in caplog.text


def test_interactive_turns_do_not_wait_for_each_other(daemon: InProcessDaemon, tmp_path: Path) -> None:
    events = tmp_path / "events"
    loaded = len(order(events))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        main = pool.submit(daemon.http, "POST", "/v1/chat/completions", json=MAIN)
        wait_until(lambda: len(order(events)) > loaded, "the main turn to reach the engine")
        assert daemon.http("POST", "/v1/chat/completions", json=MAIN).status_code == 200
        assert main.result().status_code == 200
    assert order(events)[loaded:][:2] == ["request", "request"]  # both at the engine at once
