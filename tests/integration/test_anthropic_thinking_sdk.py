"""Thinking through the Messages requests served through chat completions (a tool choice llama-server's
own Messages loses: compat/anthropic_chat.py), with the official `anthropic` SDK against the scripted
engine, whose chat answers carry `reasoning_content`: the stream helper accumulates a thinking block with a
signature (its `signature_delta` came before the block stopped), the unstreamed message carries one too,
and a later turn that sends the thinking back gives it to the engine as the turn's `reasoning_content`,
which a real llama-server (b11434) takes on its chat completions.

On the engine's own Messages route, where llama-server signs with an empty string, the block gets the same
signature (compat/thinking_signature.py): against the scripted engine, shaped as b11434 answers, and against
a real llama-server serving the tiny model with a template that opens `<think>` (tests/models.py), so that
all it writes is reasoning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from modelrunner.compat.thinking_signature import signature
from tests.conformance.dmr_daemons import FakeDaemons
from tests.daemon import Daemon
from tests.engines import tiny_daemon
from tests.inprocess import InProcessDaemon
from tests.models import THINKING_CHAT_TEMPLATE, write_tiny_gguf

REASONING = "The user greets me; answer briefly."
TOOLS: Any = [{"name": "get_weather", "input_schema": {"type": "object"}}]
NONE: Any = {"type": "none"}  # a choice served through chat completions on llama.cpp
HI: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
def daemon(fake_daemons: FakeDaemons, tmp_path: Path) -> InProcessDaemon:
    env = {"FAKE_TEXT": "Hello there.", "FAKE_REASONING": REASONING, "FAKE_EVENTS": str(tmp_path / "ev")}
    return fake_daemons.start(env)


def client(daemon: InProcessDaemon | Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)


def chat_bodies(tmp_path: Path) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in (tmp_path / "ev").read_text().splitlines()]
    return [e["body"] for e in events if e.get("event") == "chat"]


def test_a_streamed_thinking_block_is_signed_and_goes_back_as_reasoning(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    messages = client(daemon).messages
    with messages.stream(model="tiny", max_tokens=50, messages=HI, tools=TOOLS, tool_choice=NONE) as stream:
        raw = [e for e in stream if e.type.startswith(("message", "content_block"))]  # not the helper's
        kinds = [(event.type, getattr(event, "delta", None)) for event in raw]
        answer = stream.get_final_message()
    thinking, text = answer.content
    assert thinking.type == "thinking" and thinking.thinking == REASONING and thinking.signature
    assert text.type == "text" and text.text == "Hello there."
    signed = [i for i, (_, d) in enumerate(kinds) if getattr(d, "type", None) == "signature_delta"]
    assert len(signed) == 1 and kinds[signed[0] + 1][0] == "content_block_stop"

    history: Any = [*HI, {"role": "assistant", "content": answer.content}]
    history.append({"role": "user", "content": "more"})
    again = messages.create(model="tiny", max_tokens=50, messages=history, tools=TOOLS, tool_choice=NONE)
    assert again.content[0].type == "thinking" and again.content[0].signature
    sent = chat_bodies(tmp_path)[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["reasoning_content"] == REASONING and sent[1]["content"] == "Hello there."


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path_factory.mktemp("thinking"), llama_server) as running:
        yield running


def test_llama_server_takes_past_thinking_on_the_chat_path(llama: Daemon) -> None:
    thought: Any = {"type": "thinking", "thinking": "Greet back.", "signature": "from another turn"}
    for turn in ([thought, {"type": "text", "text": "Hi."}], [thought]):  # a turn of thinking alone too
        history: Any = [*HI, {"role": "assistant", "content": turn}, {"role": "user", "content": "again"}]
        answer = client(llama).messages.create(
            model="tiny", max_tokens=4, messages=history, tools=TOOLS, tool_choice=NONE
        )
        assert answer.stop_reason in ("end_turn", "max_tokens") and answer.usage.output_tokens > 0


def streamed(daemon: InProcessDaemon | Daemon, **request: Any) -> tuple[list[Any], anthropic.types.Message]:
    """The stream's own events (not the helper's) and the message the SDK's helper accumulated."""
    with client(daemon).messages.stream(**request) as stream:
        raw = [e for e in stream if e.type.startswith(("message", "content_block"))]
        return raw, stream.get_final_message()


def signed_thinking(raw: list[Any], answer: anthropic.types.Message) -> str:
    """The thinking of the answer's first block, which is signed by the one `signature_delta` that came right
    before the block stopped."""
    thinking = answer.content[0]
    assert thinking.type == "thinking" and thinking.signature == signature(thinking.thinking)
    deltas = [getattr(getattr(event, "delta", None), "type", None) for event in raw]
    assert deltas.count("signature_delta") == 1
    after = raw[deltas.index("signature_delta") + 1]
    assert after.type == "content_block_stop" and after.index == 0
    return thinking.thinking


def test_the_engines_own_thinking_block_is_signed(daemon: InProcessDaemon) -> None:
    raw, answer = streamed(daemon, model="tiny", max_tokens=50, messages=HI)
    assert signed_thinking(raw, answer) == REASONING
    assert answer.content[1].type == "text" and answer.content[1].text == "Hello there."
    again = client(daemon).messages.create(model="tiny", max_tokens=50, messages=HI)
    assert again.content[0].type == "thinking" and again.content[0].signature == signature(REASONING)


@pytest.fixture(scope="module")
def thinker(llama: Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model packaged with a template that opens `<think>`, on the real llama-server."""
    folder = tmp_path_factory.mktemp("thinker")
    template = folder / "thinking.jinja"
    template.write_text(THINKING_CHAT_TEMPLATE)
    gguf = write_tiny_gguf(folder / "thinker.gguf")
    llama.cli("package", "--gguf", str(gguf), "--chat-template", str(template), "thinker")
    return "thinker"


def test_llama_servers_own_thinking_block_is_signed(llama: Daemon, thinker: str) -> None:
    request: Any = {"model": thinker, "max_tokens": 8, "messages": HI, "extra_body": {"temperature": 0}}
    raw, answer = streamed(llama, **request)
    thought = signed_thinking(raw, answer)
    assert thought and answer.stop_reason == "max_tokens"  # all it wrote is reasoning
    again = client(llama).messages.create(**request)
    assert again.content[0].type == "thinking" and again.content[0].thinking
    assert again.content[0].signature == signature(again.content[0].thinking)
    history: Any = [
        *HI,
        {"role": "assistant", "content": answer.content},
        {"role": "user", "content": "more"},
    ]
    back = client(llama).messages.create(**{**request, "messages": history})
    assert back.content[0].type == "thinking" and back.content[0].signature  # the block went back
