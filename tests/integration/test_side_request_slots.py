"""Side requests leave the agent's conversation where it is (issue 39), on a real llama-server with SmolLM2
(quantized): an agent's turn (a ~1,500-token system prompt and a tool), then the side requests agents send
(titles, a summary: no tools, prompts of their own), then the agent's next turn, whose prompt comes from the
cache all but its new end. llama-server puts a request on the idle slot whose prompt it shares most, else on
the least recently used one, among the daemon's default slots; the side requests wait for the turn in flight
(scheduler/conversations.py Turns) and so never take the slot the turn is still filling."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelrunner.embedded import smollm2_gguf
from tests.daemon import Daemon
from tests.engines import llama_daemon
from tests.models import CHAT_TEMPLATE

pytestmark = pytest.mark.integration

SYSTEM = "\n".join(f"Rule {i}: keep the change to file {i} small and say what it does." for i in range(90))
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
GREEDY: Any = {"temperature": 0, "max_tokens": 4}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("side-request-slots")
    template = home / "chatml.jinja"
    template.write_text(CHAT_TEMPLATE)
    with llama_daemon(home, llama_server) as running:
        running.cli("package", "--gguf", str(smollm2_gguf()), "--chat-template", str(template), "smol")
        yield running


def turn(daemon: Daemon, ask: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}]
    body = {"model": "smol", "messages": messages, "tools": TOOLS, **GREEDY}
    answer = daemon.http("POST", "/engines/v1/chat/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    usage: dict[str, Any] = answer.json()["usage"]
    return usage


def test_the_agents_next_turn_finds_its_prompt_after_its_side_requests(daemon: Daemon) -> None:
    first = turn(daemon, "Rename the function in file 3.")
    for ask in ("Write a five-word title for: rename a function", "Summarise: a rename", "Title: renaming"):
        body = {"model": "smol", "messages": [{"role": "user", "content": ask}], **GREEDY}
        assert daemon.http("POST", "/engines/v1/chat/completions", json=body).status_code == 200
    second = turn(daemon, "Rename the function in file 4.")
    assert first["prompt_tokens"] > 1_000
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["prompt_tokens"] - 20, f"{cached} of {second['prompt_tokens']} from the cache"
