"""An agent's conversations on one runner: a retry finds its cache, and the interactive turn goes first.

**A retry finds its cache.**
An agent whose client gave up on a long prefill (Claude Code after 10 minutes, OpenCode after 300 s of
silence) sends the same request again at once. The daemon cancels the first at once, but the engine finishes
the batch it is computing (seconds on a CPU) before its slot is free, and an engine that chooses slots itself
(llama-server: the idle slot whose prompt is most similar, else the least recently used) then puts the retry
on another slot, where its prefill starts from zero while the first slot holds the tokens done so far. So the
scheduler remembers, per runner, the conversations abandoned while the engine worked on them, and a request
that continues or repeats one of them waits (briefly: `DRAIN_BOUND`) until the engine says it works on no
more requests than the daemon has live; then the engine's own choice finds the slot with its prefix. Only
then: everything else goes at once.

**The interactive turn first.** Coding agents send side requests (a title, a summary) at the moment of the
main turn, and on a CPU they share its cores: the main turn's first token came later by the side request's
whole prefill. A request that declares tools is an agent's interactive turn (Claude Code, Codex and OpenCode
declare them on every main turn, none on their titles and summaries); any other completion request waits
while the runner has interactive turns in flight, at most `MODEL_RUNNER_SIDE_WAIT` seconds (default 30; 0:
no waiting), so it never waits long, and never for another side request. An agent sends a turn's side
requests at the moment of the turn, sometimes first: on a runner that served an interactive turn in the last
ACTIVE_WINDOW, a side request first gives the turn sent with it GRACE to arrive (measured: without it the
side requests were ahead as often as not, and the main turn's first token came 1.2x later).

A conversation is a head (the fields before the message list in the prompt: system, instructions, tools)
and its messages, each a digest of its JSON without cache marks (`cache_control` moves from message to
message between an agent's turns). It is computed only for the requests this concerns: one abandoned, and
those sent while one is remembered.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from modelrunner.config import env_seconds

HEAD_FIELDS = ("system", "instructions", "tools")  # what comes before the messages in the prompt
LIST_FIELDS = ("messages", "input", "prompt")  # the conversation: chat and Messages, Responses, completions
CACHE_MARK = "cache_control"
# Seconds a retry waits for the engine to finish the abandoned request's batch: the engine checks for a
# cancel between batches (2,048 tokens took 70 s on a busy 2-core CPU), and a retry elsewhere prefills
# everything again, so it waits long; only an engine that never lets go ends the wait.
DRAIN_BOUND = 120.0
# How often the engine is asked meanwhile: no more than every 2.5 s, as llama-server b11434 looks for a closed
# client connection only when a stream's wait for results times out (1 s) and every answer to GET /slots
# wakes that wait: polled every 0.2 s, the abandoned prefill was never cancelled (measured).
POLL_SECONDS = 2.5


def _unmarked(value: Any) -> Any:
    """`value` without Anthropic's cache marks, which say nothing of the prompt's tokens."""
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != CACHE_MARK}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def _digest(value: Any) -> bytes:
    raw = json.dumps(_unmarked(value), separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.blake2b(raw, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Conversation:
    head: bytes
    parts: tuple[bytes, ...]  # each message's digest, in order

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Conversation | None:
        """The conversation of an engine request's body; None when it has none."""
        listed = next((doc[name] for name in LIST_FIELDS if name in doc), None)
        if listed is None:
            return None
        items = listed if isinstance(listed, list) else [listed]  # a string prompt is one part
        head = _digest({name: doc[name] for name in HEAD_FIELDS if name in doc})
        return cls(head, tuple(_digest(item) for item in items))

    def continues(self, earlier: Conversation) -> bool:
        """This conversation repeats `earlier` or extends it (a retry, or its next turn)."""
        return (
            self.head == earlier.head
            and len(self.parts) >= len(earlier.parts)
            and self.parts[: len(earlier.parts)] == earlier.parts
        )


@dataclass(slots=True)
class Abandoned:
    """One runner's conversations abandoned while its engine worked on them, each kept DRAIN_BOUND."""

    entries: list[tuple[Conversation, float]] = field(default_factory=list)
    waiting: int = 0  # requests waiting for the engine to let them go: held runners, not engine work

    def add(self, conversation: Conversation) -> None:
        self.entries.append((conversation, time.monotonic()))

    def continued_by(self, conversation: Conversation) -> bool:
        recent = time.monotonic() - DRAIN_BOUND
        self.entries = [(c, at) for c, at in self.entries if at > recent]
        return any(conversation.continues(c) for c, _ in self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def drained(self) -> None:
        """The engine works on no abandoned request any more."""
        self.entries.clear()


SIDE_WAIT = 30.0  # MODEL_RUNNER_SIDE_WAIT's default
ACTIVE_WINDOW = 600.0  # an agent's session is on while its interactive turns are this close
GRACE = 0.3  # seconds a side request gives the turn sent with it to arrive first


def side_wait_from_env() -> float:
    return env_seconds("MODEL_RUNNER_SIDE_WAIT", SIDE_WAIT)


def interactive(doc: dict[str, Any]) -> bool:
    """An agent's main turn: it declares tools."""
    return bool(doc.get("tools"))


class Turns:
    """One runner's interactive requests in flight, which side requests wait for (at most `bound`)."""

    def __init__(self, bound: float) -> None:
        self.bound = bound
        self.interactive = 0
        self.last_interactive = -ACTIVE_WINDOW  # time.monotonic() of the last one's start
        self._none = asyncio.Event()
        self._none.set()

    def begin(self) -> None:
        self.interactive += 1
        self.last_interactive = time.monotonic()
        self._none.clear()

    def end(self) -> None:
        self.interactive -= 1
        if self.interactive == 0:
            self._none.set()

    def side_requests_wait(self) -> bool:
        """Whether a side request waits now: interactive turns in flight, or an agent at work (its next turn
        may be on its way)."""
        recent = time.monotonic() - self.last_interactive < ACTIVE_WINDOW
        return self.bound > 0 and (self.interactive > 0 or recent)

    async def side_turn(self) -> float:
        """Wait until no interactive request is in flight, or `bound` has passed: the seconds waited."""
        if not self.side_requests_wait():
            return 0.0
        started = time.monotonic()
        if started - self.last_interactive < ACTIVE_WINDOW:  # an agent at work: its turn may be on its way
            await asyncio.sleep(min(GRACE, self.bound))
        if self.interactive:
            left = self.bound - (time.monotonic() - started)
            with contextlib.suppress(TimeoutError):  # it goes after all
                await asyncio.wait_for(self._none.wait(), max(left, 0.0))
        return time.monotonic() - started
