"""server/keepalive.py: pings while a start waits, between events of a silent stream, and nothing left
running or open when the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from modelrunner.errors import BadRequest, ModelRunnerError
from modelrunner.server import keepalive

PING = b": keep-alive\n\n"


class Made:
    """What a start makes: closed if nobody takes it."""

    def __init__(self) -> None:
        self.closed = False


async def close(made: Made) -> None:
    made.closed = True


def failed(exc: ModelRunnerError) -> bytes:
    return b"data: " + exc.message.encode() + b"\n\n"


async def collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in stream]


async def answer(_: Made) -> AsyncIterator[bytes]:
    yield b"data: 1\n\n"
    yield b"data: 2\n\n"


def test_a_quick_start_is_returned_as_it_is() -> None:
    async def run() -> None:
        made = Made()

        async def start() -> Made:
            return made

        assert await keepalive.within(start(), 1.0, close) is made

    asyncio.run(run())


def test_a_quick_refusal_is_raised_before_any_stream() -> None:
    async def run() -> None:
        async def start() -> Made:
            raise BadRequest("too long")

        with pytest.raises(BadRequest):
            await keepalive.within(start(), 1.0, close)

    asyncio.run(run())


def test_a_slow_start_pings_then_streams() -> None:
    async def run() -> None:
        async def start() -> Made:
            await asyncio.sleep(0.3)
            return Made()

        task = await keepalive.within(start(), 0.05, close)
        assert isinstance(task, asyncio.Task)
        out = await collect(keepalive.waiting(task, answer, PING, 0.05, failed, close))
        assert out[0] == PING and out[-2:] == [b"data: 1\n\n", b"data: 2\n\n"]
        assert set(out[:-2]) == {PING}

    asyncio.run(run())


def test_a_late_refusal_is_the_streams_error_event() -> None:
    async def run() -> None:
        async def start() -> Made:
            await asyncio.sleep(0.2)
            raise BadRequest("too long")

        task = await keepalive.within(start(), 0.05, close)
        assert isinstance(task, asyncio.Task)
        out = await collect(keepalive.waiting(task, answer, PING, 0.05, failed, close))
        assert out[-1] == b"data: too long\n\n" and set(out[:-1]) == {PING}

    asyncio.run(run())


def test_a_client_that_leaves_while_it_waits_cancels_the_start() -> None:
    async def run() -> None:
        made, ended = Made(), asyncio.Event()

        async def start() -> Made:
            try:
                await asyncio.sleep(60)
            finally:
                ended.set()
            return made

        task = await keepalive.within(start(), 0.01, close)
        assert isinstance(task, asyncio.Task)
        stream = keepalive.waiting(task, answer, PING, 0.01, failed, close)
        assert isinstance(stream, AsyncGenerator)  # an async generator function's stream, closable
        assert await anext(stream) == PING
        await stream.aclose()  # what the server does with the stream of a client that left
        assert ended.is_set() and task.cancelled()

    asyncio.run(run())


def test_a_start_that_finishes_as_the_client_leaves_is_closed() -> None:
    async def run() -> None:
        made = Made()

        async def start() -> Made:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                return made  # it made its result all the same
            return made

        task = asyncio.ensure_future(start())
        await asyncio.sleep(0)
        await keepalive.discard(task, close)
        assert made.closed

    asyncio.run(run())


def test_pings_go_only_between_events() -> None:
    async def run() -> None:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"data: hal"
            await asyncio.sleep(0.2)
            yield b"f\n\n"
            await asyncio.sleep(0.2)
            yield b"data: end\n\n"

        out = await collect(keepalive.pinged(chunks(), PING, 0.05))
        assert out[:2] == [b"data: hal", b"f\n\n"]  # none inside the half-sent event
        assert PING in out[2:-1] and out[-1] == b"data: end\n\n"

    asyncio.run(run())


def test_the_interval_is_configured() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(keepalive.ENV, "0.5")
        assert keepalive.interval() == 0.5
        patch.setenv(keepalive.ENV, "soon")
        with pytest.raises(ValueError, match=keepalive.ENV):
            keepalive.interval()
        patch.delenv(keepalive.ENV)
        assert keepalive.interval() == keepalive.DEFAULT_INTERVAL


def test_a_refusal_after_an_early_head_is_the_openai_streams_error() -> None:
    body = b'{"error": {"message": "too long", "type": "invalid_request_error", "code": "x"}}'
    assert keepalive.error_event(body) == b"data: " + body + b"\n\n"
    event = keepalive.error_event(b'{"type": "error", "message": "engine died"}')
    assert event.startswith(b'data: {"error": {"message": "engine died"')
