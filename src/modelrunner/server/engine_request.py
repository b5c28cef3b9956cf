"""One preparation of a request for its engine, for every API family: the OpenAI routes (server/inference.py,
and the HTTP front through it) and the translated ones (Ollama, Anthropic, Responses: `call_engine`).

`prepare` checks what must be refused before a model loads (a bad schema, a forced tool not declared, a
need the model lacks), gets the runner, and turns the request into the engine's body: the billing line
dropped, the model named as the runner knows it, embeddings shortened by the daemon, the schema's grammar,
declared tools and tool choice as the engine takes them, a non-streamed generation asked for as a stream to
assemble; a retry of a request its client left waits for the engine to finish that one's batch, a side
request for the agent's interactive turns (scheduler/conversations.py). A rule added here applies to every
API family. What differs between the families is what they bring: a parsed body (the OpenAI routes keep
its bytes, sent again only if changed) or one they built, and how they send it (the front's byte relay, or
a `ServedCall`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from modelrunner import eventlog
from modelrunner.compat import anthropic_chat, assemble, billing, structured, tool_choice, tool_rescue
from modelrunner.compat.embeddings import Shortening
from modelrunner.engines.base import Engine, Mode
from modelrunner.scheduler.conversations import DRAIN_BOUND, POLL_SECONDS, Conversation, interactive
from modelrunner.scheduler.runner import Runner
from modelrunner.server import capabilities, keepalive, lifecycle
from modelrunner.server.lifecycle import Exchange, Inference
from modelrunner.server.served_call import ServedCall
from modelrunner.server.upstream import EngineCall

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """A request ready for its engine: the runner it holds, where and what to send, how to answer."""

    runner: Runner
    path: str  # the engine's: a Messages request it serves through chat goes to chat completions
    doc: dict[str, Any]  # the engine's body
    changed: bool  # `doc` is not the body the client sent: its bytes are written anew
    load_seconds: float  # the wait for the runner
    assembling: str | None = None  # the path whose unstreamed answer is assembled from the stream asked for
    shortening: Shortening | None = None  # an embeddings request's `dimensions`, done by the daemon
    constraint: structured.Constraint | None = None  # the JSON its answer must be
    tools: tool_rescue.Tools | None = None  # calls written as text are rescued (compat/tool_rescue.py)

    def body(self, sent: bytes | None = None) -> bytes:
        """The bytes to send: those the client `sent` when nothing changed (no second serialisation)."""
        return sent if sent is not None and not self.changed else json.dumps(self.doc).encode()

    def call(self, exchange: Exchange) -> ServedCall:
        """The engine call that sends this request, and the steps that treat its answer as prepared."""
        engine = EngineCall(exchange, self.runner, self.load_seconds)
        return ServedCall(engine, self.path, self.assembling, self.shortening, self.constraint, self.tools)


async def prepare(
    inference: Inference,
    name: str,
    path: str,
    doc: dict[str, Any],
    mode: Mode = Mode.COMPLETION,
    keep_alive: float | None = None,
    backend: str | None = None,
    preload: bool = False,
) -> EngineRequest:
    """A runner for the model called `name`, held by the current exchange, and the body to send it.
    `preload` (DMR's `X-Preload-Only`): only the load; nothing is asked of the body, nothing recorded."""
    doc, changed = _changed(doc, billing.neutralised(path, doc))  # a per-request nonce busts the prefix cache
    shortening = Shortening.of(doc) if mode is Mode.EMBEDDING else None
    needs, schema, forced = capabilities.NOTHING, None, None
    if not preload:  # each refused before a model loads
        needs = capabilities.needs_of(path, doc)
        schema = structured.requested_schema(path, doc)
        forced = tool_choice.forced(path, doc)
    keepalive.announce_constraint(inference, name, backend, schema)  # a stream's head may go out early
    started = time.monotonic()
    runner = await inference.acquire(name, mode, keep_alive, backend, record=not preload, needs=needs)
    load_seconds = time.monotonic() - started
    engine = inference.engines[runner.key.engine]
    if runner.model.reference != name:
        # Engines such as vLLM answer only to the names they were started with: another name of the same
        # model (a tag, the short form) is sent as the runner's.
        doc, changed = {**doc, "model": runner.model.reference}, True
    if shortening is not None:
        doc, changed = shortening.engine_request(doc), True
    if anthropic_chat.through_chat(
        engine.ignores_forced_tool_choice, path, doc
    ):  # a tool choice the engine's Messages loses
        path, doc, changed = assemble.CHAT, anthropic_chat.chat_request(doc), True
    constraint = None
    if schema is not None:
        constraint = structured.Constraint(schema, enforced=engine.schema_grammar)
        engine_doc = constraint.engine_request(engine.completions_json_schema, path, doc)
        doc, changed = _changed(doc, engine_doc, changed)
    engine_doc, tools = tool_choice.engine_request(engine.ignores_forced_tool_choice, path, doc, forced)
    doc, changed = _changed(doc, engine_doc, changed)
    assembling = None
    if engine.assembles_unstreamed and assemble.streamable(path, doc):
        assembling, doc, changed = path, assemble.streamed_request(path, doc), True
    if not preload and mode is Mode.COMPLETION:
        if engine.chooses_slots:
            await _after_abandoned(engine, runner, doc)
        await _interactive_first(runner, doc)
    return EngineRequest(runner, path, doc, changed, load_seconds, assembling, shortening, constraint, tools)


async def _after_abandoned(engine: Engine, runner: Runner, doc: dict[str, Any]) -> None:
    """A request that continues a conversation whose client left while the engine worked on it waits until
    the engine has let it go (at most DRAIN_BOUND), so that the engine puts it where its prefix is cached;
    this request, if its client leaves while the engine works on it, is remembered so (the module says
    why)."""
    exchange = lifecycle.current()
    abandoned = runner.abandoned

    def ended() -> None:  # at the exchange's end, or as its client leaves
        if exchange.client_gone and not exchange.complete:
            conversation = Conversation.of(doc)
            if conversation is not None:
                abandoned.add(conversation)

    if abandoned:
        conversation = Conversation.of(doc)
        if conversation is not None and abandoned.continued_by(conversation):
            await _wait_for_engine(engine, runner, exchange)
    exchange.opened(ended)


async def _interactive_first(runner: Runner, doc: dict[str, Any]) -> None:
    """An interactive turn is counted while it runs; a side request waits for those (scheduler/
    conversations.py says which are which, and how long at most)."""
    exchange = lifecycle.current()
    turns = runner.turns
    if interactive(doc):
        exchange.opened(turns.end)  # at the exchange's end, or as its client leaves
        turns.begin()
        return
    if not turns.side_requests_wait():
        return
    async with exchange.waiting():
        waited = await turns.side_turn()
    if waited:
        eventlog.event(log, "side_request_waited", model=runner.model.reference, seconds=round(waited, 2))


async def _wait_for_engine(engine: Engine, runner: Runner, exchange: Exchange) -> None:
    abandoned = runner.abandoned
    started = time.monotonic()
    working: int | None = None
    abandoned.waiting += 1
    try:
        async with exchange.waiting():
            while time.monotonic() - started < DRAIN_BOUND:
                working = await engine.working_slots(runner.spec.socket, POLL_SECONDS)
                if working is None or working <= runner.in_use - abandoned.waiting:
                    abandoned.drained()
                    break
                await asyncio.sleep(POLL_SECONDS)
    finally:
        abandoned.waiting -= 1
    eventlog.event(
        log,
        "waited_for_abandoned",
        model=runner.model.reference,
        seconds=round(time.monotonic() - started, 2),
        engine_working=working,
    )


def _changed(doc: dict[str, Any], out: dict[str, Any], changed: bool = False) -> tuple[dict[str, Any], bool]:
    """`out`, and whether the body changed: the compat/ rewrites return the very object they left alone."""
    return out, changed or out is not doc


async def call_engine(
    inference: Inference,
    name: str,
    path: str,
    body: dict[str, Any],
    mode: Mode = Mode.COMPLETION,
    keep_alive: float | None = None,
    backend: str | None = None,
) -> ServedCall:
    """POST `body` (prepared as above) to `path` of the model's runner; the answer's head is read and its
    status checked (an error status raises EngineFailed before anything is streamed), its body not yet."""
    request = await prepare(inference, name, path, body, mode, keep_alive, backend)
    call = request.call(lifecycle.current())
    try:
        await call.send(request.path, request.body())
        await call.raise_for_status()
    except BaseException:
        await call.close()
        raise
    return call
