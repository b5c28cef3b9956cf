"""Replayed agent sessions (issue 22 item 3; tests/agent_sessions.py): Claude Code on Messages, Codex on
Responses and OpenCode on chat completions, through the real daemon on llama-server with the tiny GGUF (2048
tokens of context: its vocabulary spells the tools' JSON nearly a token a character) and the official SDKs.
Every turn is a 200 whose stream the SDK parses, with usage; from the second main turn on, the cached tokens
cover the previous main turn's prompt but for a small tail, side calls in between notwithstanding; Claude
Code's `count_tokens` is the input total the turn then reports, whatever its billing line held."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from tests.agent_sessions import MAIN, TurnResult, run_claude_code, run_codex, run_opencode
from tests.daemon import Daemon
from tests.engines import tiny_daemon
from tests.models import write_tiny_gguf

MODEL = "tiny-2k"
# llama-server evaluates the prompt's last token again, and the generation prompt that ended the previous
# turn may tokenize differently once the assistant's turn follows it
TAIL = 8


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("agent-sessions")
    with tiny_daemon(home, llama_server) as running:
        running.cli("package", "--gguf", str(write_tiny_gguf(home / "long.gguf", context_length=2048)), MODEL)
        yield running


def assert_main_loop_cached(turns: list[TurnResult]) -> None:
    assert all(turn.events > 0 and turn.prompt_tokens > 0 for turn in turns), turns
    main = [turn for turn in turns if turn.kind == MAIN]
    assert main[0].cached_tokens < main[0].prompt_tokens
    for previous, turn in itertools.pairwise(main):
        assert turn.prompt_tokens > previous.prompt_tokens, (previous, turn)
        assert previous.prompt_tokens - TAIL <= turn.cached_tokens < turn.prompt_tokens, (previous, turn)


def test_claude_code_session(daemon: Daemon) -> None:
    client = anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)
    turns = run_claude_code(client, MODEL, max_tokens=4)
    assert [turn.kind for turn in turns].count("side") == 2
    assert_main_loop_cached(turns)
    assert all(turn.counted == turn.prompt_tokens for turn in turns if turn.kind == MAIN), turns


def test_codex_session(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    turns = run_codex(client, MODEL, max_tokens=4)
    assert_main_loop_cached(turns)


def test_opencode_session(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    turns = run_opencode(client, MODEL, max_tokens=64)  # room for the forced call
    assert_main_loop_cached(turns)
    [(name, arguments)] = turns[-1].tool_calls  # the forced `todoread`, assembled from its deltas
    assert name == "todoread" and isinstance(json.loads(arguments), dict)
