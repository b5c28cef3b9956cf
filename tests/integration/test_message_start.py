"""A streamed Anthropic answer that lacks the engine's `message_start` (llama-server b11434 skips it when its
first tokens are an incomplete UTF-8 sequence) gets the daemon's, whose `input_tokens` is the prompt as the
engine counts it (`/v1/messages/count_tokens`), not 0: the real daemon, the fake engine scripted to skip it
(FAKE_NO_MESSAGE_START), through the official `anthropic` client, with tools declared or not (the two
relays of server/anthropic_serving.py); and so does an unstreamed answer assembled from such a stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.conformance.dmr_daemons import FakeDaemons
from tests.fake_engine import INPUT_TOKENS, FakeEngine
from tests.inprocess import InProcessDaemon

HI: Any = [{"role": "user", "content": "hi"}]
TOOLS: Any = [{"name": "get_time", "input_schema": {"type": "object"}}]


@pytest.fixture
def daemon(fake_daemons: FakeDaemons, tmp_path: Path) -> tuple[InProcessDaemon, Path]:
    """A daemon on the fake engine in llama.cpp's place, streaming messages without `message_start`, and
    the log of the requests the engine got."""
    events = tmp_path / "events.jsonl"
    engine = FakeEngine("llama.cpp", env={"FAKE_EVENTS": str(events), "FAKE_NO_MESSAGE_START": "1"})
    return fake_daemons.start(engines={"llama.cpp": engine}), events


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["relayed", "rescued"])
def test_the_daemons_message_start_counts_the_prompt(
    daemon: tuple[InProcessDaemon, Path], tools: Any
) -> None:
    running, log = daemon
    client = anthropic.Anthropic(base_url=running.url + "/anthropic", api_key="unused", max_retries=0)
    extra: Any = {"tools": tools} if tools else {}
    with client.messages.stream(model="tiny", max_tokens=8, messages=HI, **extra) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and message.content[0].type == "text"
    assert message.usage.input_tokens == INPUT_TOKENS and message.usage.output_tokens == 5
    assert engine_paths(log) == ["/v1/messages", "/v1/messages/count_tokens"]  # counted beside the stream


def test_an_unstreamed_answer_assembled_from_such_a_stream_counts_the_prompt(
    daemon: tuple[InProcessDaemon, Path],
) -> None:
    """On llama.cpp an unstreamed request is asked for as a stream and assembled (compat/assemble.py)."""
    running, log = daemon
    client = anthropic.Anthropic(base_url=running.url + "/anthropic", api_key="unused", max_retries=0)
    message = client.messages.create(model="tiny", max_tokens=8, messages=HI)
    assert message.content[0].type == "text" and message.stop_reason == "end_turn"
    assert message.usage.input_tokens == INPUT_TOKENS and message.usage.output_tokens == 5
    assert engine_paths(log) == ["/v1/messages", "/v1/messages/count_tokens"]


def engine_paths(log: Path) -> list[str]:
    return [e["path"] for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "request"]
