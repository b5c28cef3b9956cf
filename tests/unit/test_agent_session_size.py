"""The sized Claude Code session of tests/agent_sessions.py (bench/agents.py's --system-tokens and
--main-turns): the defaults stay the session tests/integration/test_agent_sessions.py asserts on; a larger one
keeps each main turn an extension of the previous one (what the cache measurement relies on)."""

from __future__ import annotations

import itertools

from tests.agent_prompts import CHARS_PER_TOKEN, padded_system
from tests.agent_sessions import CLAUDE_SYSTEM, MAIN, SIDE, claude_code


def test_defaults_are_the_tested_session() -> None:
    turns = claude_code()
    assert [turn.kind for turn in turns] == [MAIN, SIDE, MAIN, MAIN, SIDE, MAIN, MAIN]
    assert all(turn.request["system"][1]["text"] == CLAUDE_SYSTEM for turn in turns if turn.kind == MAIN)


def test_bench_size_is_twelve_requests_each_main_turn_extending_the_last() -> None:
    turns = claude_code(main_turns=9, system_tokens=2800)
    assert len(turns) == 12 and [turn.kind for turn in turns].count(SIDE) == 3
    main = [turn.request for turn in turns if turn.kind == MAIN]
    for previous, turn in itertools.pairwise(main):
        assert turn["system"][1:] == previous["system"][1:]  # only the billing line changes
        assert turn["system"][0] != previous["system"][0]
        assert turn["messages"][: len(previous["messages"])] == previous["messages"]
        assert len(turn["messages"]) == len(previous["messages"]) + 2  # a tool_use and its tool_result
    ids = [
        block["id"]
        for request in main
        for message in request["messages"][1::2]
        for block in message["content"]
    ]
    assert len(set(ids)) == len(main) - 1


def test_padded_system_reaches_its_size_with_distinct_sections() -> None:
    text = padded_system(CLAUDE_SYSTEM, 2800)
    assert 2800 * CHARS_PER_TOKEN <= len(text) < 2900 * CHARS_PER_TOKEN
    sections = text.split("\n\n")
    assert sections[0] == CLAUDE_SYSTEM and len(set(sections)) == len(sections)
