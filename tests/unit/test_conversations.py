"""scheduler/conversations.py: which requests continue a conversation whose client left."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from modelrunner.scheduler import conversations
from modelrunner.scheduler.conversations import Abandoned, Conversation, Turns, interactive

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 20}
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def chat(*messages: dict[str, Any], tools: list[Any] | None = TOOLS) -> Conversation:
    doc: dict[str, Any] = {"model": "m", "messages": [SYSTEM, *messages], "stream": True}
    if tools is not None:
        doc["tools"] = tools
    conversation = Conversation.of(doc)
    assert conversation is not None
    return conversation


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_a_retry_and_the_next_turn_continue_a_conversation_a_side_request_does_not() -> None:
    first = chat(user("fix the bug"))
    assert chat(user("fix the bug")).continues(first)  # the same request again
    assert chat(user("fix the bug"), {"role": "assistant", "content": "ok"}, user("test")).continues(first)
    assert not chat(user("fix another bug")).continues(first)
    assert not chat(user("fix the bug"), tools=None).continues(first)  # another head: another prompt
    assert not chat().continues(first)  # shorter


def test_sampling_fields_do_not_change_a_conversation() -> None:
    plain = Conversation.of({"messages": [user("a")], "stream": True, "max_tokens": 5})
    other = Conversation.of({"messages": [user("a")], "temperature": 0})
    assert plain is not None and other is not None and other.continues(plain)


def test_cache_marks_moving_between_turns_do_not_break_a_conversation() -> None:
    def messages(marked: int) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": "read a.py"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "user", "content": [{"type": "text", "text": "and b.py"}]},
        ]
        blocks[marked]["content"][0]["cache_control"] = {"type": "ephemeral"}
        return blocks

    system = [{"type": "text", "text": "agent", "cache_control": {"type": "ephemeral"}}]
    turn1 = Conversation.of({"system": system, "messages": messages(0)[:1]})
    turn2 = Conversation.of({"system": [{"type": "text", "text": "agent"}], "messages": messages(2)})
    assert turn1 is not None and turn2 is not None and turn2.continues(turn1)


def test_responses_input_and_a_completion_prompt_are_conversations() -> None:
    first = Conversation.of({"instructions": "x", "input": "hello"})
    again = Conversation.of({"instructions": "x", "input": "hello", "stream": True})
    assert first is not None and again is not None and again.continues(first)
    assert Conversation.of({"prompt": "once upon"}) is not None
    assert Conversation.of({"model": "m"}) is None


def test_abandoned_conversations_are_kept_for_the_drain_bound_only(monkeypatch: pytest.MonkeyPatch) -> None:
    abandoned = Abandoned()
    assert not abandoned
    left = chat(user("long prefill"))
    abandoned.add(left)
    assert abandoned and abandoned.continued_by(chat(user("long prefill")))
    assert not abandoned.continued_by(chat(user("a title, please"), tools=None))
    later = time.monotonic() + conversations.DRAIN_BOUND + 1
    monkeypatch.setattr("modelrunner.scheduler.conversations.time.monotonic", lambda: later)
    assert not abandoned.continued_by(chat(user("long prefill")))  # long since let go
    assert not abandoned


def test_drained_forgets_them() -> None:
    abandoned = Abandoned()
    abandoned.add(chat(user("x")))
    abandoned.drained()
    assert not abandoned.continued_by(chat(user("x")))


def test_a_side_request_waits_for_the_interactive_turns_in_flight() -> None:
    async def run() -> list[str]:
        turns, order = Turns(bound=10), []
        turns.begin()

        async def side() -> None:
            await turns.side_turn()
            order.append("side")

        waiting = asyncio.create_task(side())
        await asyncio.sleep(0.05)
        order.append("main ends")
        turns.end()
        await waiting
        return order

    assert asyncio.run(run()) == ["main ends", "side"]


def test_a_side_request_waits_at_most_the_bound_and_not_at_all_when_it_is_0() -> None:
    async def waited(bound: float) -> float:
        turns = Turns(bound)
        turns.begin()  # an interactive turn that does not end
        return await turns.side_turn()

    assert 0.1 <= asyncio.run(waited(0.1)) < 5
    assert asyncio.run(waited(0)) == 0.0
    assert asyncio.run(Turns(10).side_turn()) == 0.0  # none in flight


def test_a_request_that_declares_tools_is_interactive() -> None:
    assert interactive({"messages": [], "tools": TOOLS})
    assert not interactive({"messages": [], "tools": []})
    assert not interactive({"messages": [user("Write a title")]})


def test_during_an_agent_s_session_a_side_request_lets_the_turn_sent_with_it_go_first() -> None:
    async def run() -> list[str]:
        turns, order = Turns(bound=10), []
        turns.begin()  # the agent's previous turn
        turns.end()

        async def side() -> None:
            await turns.side_turn()
            order.append("side")

        waiting = asyncio.create_task(side())  # the side request arrives first...
        await asyncio.sleep(0.05)
        turns.begin()  # ... and the main turn sent with it a moment later
        order.append("main")
        await asyncio.sleep(0.5)
        turns.end()
        await waiting
        return order

    assert asyncio.run(run()) == ["main", "side"]
