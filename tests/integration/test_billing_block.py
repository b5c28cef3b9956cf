"""Claude Code's billing block (compat/billing.py) never reaches an engine: two requests that differ only in
its fields reach the engine as the same bytes, on every API family, through the real daemon with the fake
engine recording the bodies it receives (FAKE_BODIES); and on a real llama-server turn 2 of a session is
served from its prefix cache, and `count_tokens` is the total the same request then reports."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from modelrunner.embedded import smollm2_gguf
from tests.conformance.dmr_daemons import FakeDaemons
from tests.daemon import Daemon
from tests.engines import tiny_daemon
from tests.fake_engine import FakeEngine
from tests.inprocess import InProcessDaemon

SYSTEM = "You are a coding agent. Answer briefly."
HI: Any = [{"role": "user", "content": "hi"}]


def billing(nonce: str, version: str = "") -> str:
    """The line as Claude Code 2.1.17x sends it: both the version's suffix and `cch` change per request."""
    version = version or nonce[:3]
    return f"x-anthropic-billing-header: cc_version=2.1.177.{version}; cc_entrypoint=cli; cch={nonce};"


@pytest.fixture(params=["llama.cpp", "vllm"])
def recorded(
    request: pytest.FixtureRequest, fake_daemons: FakeDaemons, tmp_path: Path
) -> tuple[InProcessDaemon, Path]:
    """A daemon whose fake engine, in the place of each engine (the daemon drives them differently: it
    assembles llama.cpp's unstreamed answers), logs each request's body; and the log."""
    events = tmp_path / "events.jsonl"
    engine = FakeEngine(request.param, env={"FAKE_EVENTS": str(events), "FAKE_BODIES": "1"})
    return fake_daemons.start(engines={request.param: engine}), events


def engine_bodies(events: Path) -> list[tuple[str, str]]:
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    return [(e["path"], e["body"]) for e in lines if e["event"] == "request"]


def anthropic_blocks(nonce: str) -> dict[str, Any]:
    system = [
        {"type": "text", "text": billing(nonce)},
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
    ]
    return {"model": "tiny", "max_tokens": 8, "system": system, "messages": HI}


def chat_message(nonce: str) -> dict[str, Any]:  # a proxy's own system message per Anthropic block
    system = [{"role": "system", "content": billing(nonce)}, {"role": "system", "content": SYSTEM}]
    return {"model": "tiny", "messages": [*system, *HI]}


def chat_parts(nonce: str) -> dict[str, Any]:  # one system message, a text part per block
    parts = [{"type": "text", "text": billing(nonce)}, {"type": "text", "text": SYSTEM}]
    return {"model": "tiny", "messages": [{"role": "system", "content": parts}, *HI]}


def chat_joined(nonce: str) -> dict[str, Any]:  # the blocks joined into one text
    return {"model": "tiny", "messages": [{"role": "system", "content": billing(nonce) + "\n" + SYSTEM}, *HI]}


CASES: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "anthropic": ("/anthropic/v1/messages", anthropic_blocks),
    "anthropic streamed": ("/anthropic/v1/messages", lambda n: {**anthropic_blocks(n), "stream": True}),
    "anthropic system text": (
        "/v1/messages",
        lambda n: {**anthropic_blocks(n), "system": billing(n) + "\n" + SYSTEM},
    ),
    "count_tokens": ("/anthropic/v1/messages/count_tokens", anthropic_blocks),
    "chat message": ("/engines/v1/chat/completions", chat_message),
    "chat streamed": ("/engines/v1/chat/completions", lambda n: {**chat_message(n), "stream": True}),
    "chat parts": ("/engines/v1/chat/completions", chat_parts),
    "chat joined": ("/engines/v1/chat/completions", chat_joined),
    "responses": (
        "/engines/v1/responses",
        lambda n: {"model": "tiny", "instructions": billing(n) + "\n" + SYSTEM, "input": "hi"},
    ),
    "ollama": ("/api/chat", lambda n: {**chat_message(n), "stream": False}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_requests_differing_only_in_the_billing_block_reach_the_engine_byte_identical(
    recorded: tuple[InProcessDaemon, Path], case: str
) -> None:
    daemon, events = recorded
    path, request = CASES[case]
    for nonce in ("1b2c3", "9f8e7"):
        answer = daemon.http("POST", path, json=request(nonce))
        assert answer.status_code == 200, answer.text
    (first_path, first), (second_path, second) = engine_bodies(events)
    assert first_path == second_path and first == second
    assert "x-anthropic-billing-header" not in first and SYSTEM in first


def test_the_same_block_elsewhere_than_the_system_prompt_is_left_alone(
    recorded: tuple[InProcessDaemon, Path],
) -> None:
    daemon, events = recorded
    said = [{"role": "user", "content": billing("1b2c3")}]
    answer = daemon.http("POST", "/engines/v1/chat/completions", json={"model": "tiny", "messages": said})
    assert answer.status_code == 200, answer.text
    [(_, body)] = engine_bodies(events)
    assert json.loads(body)["messages"] == said


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path_factory.mktemp("billing"), llama_server) as running:
        running.cli("package", "--gguf", str(smollm2_gguf()), "smol")  # a real tokenizer, without tools
        yield running


def sdk(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)


def test_turn_two_with_a_new_billing_block_is_served_from_the_engines_cache(daemon: Daemon) -> None:
    client = sdk(daemon)
    system: Any = [{"type": "text", "text": SYSTEM + " Keep the answers short."}]
    first = client.messages.create(
        model="tiny",
        max_tokens=4,
        system=[{"type": "text", "text": billing("1b2c3")}, *system],
        messages=HI,
        extra_body={"temperature": 0, "top_k": 1},
    )
    turn: Any = [*HI, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}]
    second = client.messages.create(
        model="tiny",
        max_tokens=4,
        system=[{"type": "text", "text": billing("9f8e7")}, *system],
        messages=turn,
        extra_body={"temperature": 0, "top_k": 1},
    )
    assert (first.usage.cache_read_input_tokens or 0) == 0
    assert (second.usage.cache_read_input_tokens or 0) > 0, second.usage


@pytest.mark.parametrize("model", ["tiny", "smol"])
def test_count_tokens_is_the_input_the_same_request_then_reports(daemon: Daemon, model: str) -> None:
    """Claude Code counts with one billing line and sends the request with another; SmolLM2 tokenizes
    these two lines to 56 and 57 tokens in all (the issue's 596 against 597): with the line dropped, the
    count is the request's, whatever the line held. The tiny model's template renders tools."""
    tools: Any = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]
    request: Any = {"model": model, "messages": HI, **({"tools": tools} if model == "tiny" else {})}
    system: anthropic.types.TextBlockParam = {"type": "text", "text": "Be brief."}
    client = sdk(daemon)
    counted = client.messages.count_tokens(
        **request, system=[{"type": "text", "text": billing("f9f74", "cce")}, system]
    ).input_tokens
    usage = client.messages.create(
        **request,
        system=[{"type": "text", "text": billing("498c6", "54a")}, system],
        max_tokens=2,
        extra_body={"temperature": 0, "top_k": 1},
    ).usage
    reported = (
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    )
    assert counted == reported
