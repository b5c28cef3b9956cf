"""Just enough HTTP/1.1 to talk to engines on Unix sockets: their answers read as they arrive, with the one
response reader (response_reader.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from modelrunner.response_reader import MAX_HEAD, Head, ResponseReader, body_of

READ_SIZE = 64 * 1024
T = TypeVar("T")


class UpstreamError(Exception):
    """The engine closed the connection or sent something that is not HTTP."""


class EngineIdle(UpstreamError):
    """The engine sent nothing for the idle limit in the middle of its answer's body."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the engine sent nothing for {seconds:g} seconds")


async def _within(idle: float | None, read: Awaitable[T]) -> T:
    """`read`, or EngineIdle if nothing came within `idle` seconds (None: no limit)."""
    if idle is None:
        return await read
    try:
        async with asyncio.timeout(idle):
            return await read
    except TimeoutError:
        raise EngineIdle(idle) from None


class Answer:
    """An answer read from an engine's stream with the one response reader (response_reader.py): its
    head, then its body's data as it arrives, whatever its framing."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream
        self.reader = ResponseReader()
        self._first = b""  # body data that came with the head

    async def read_head(self) -> Head:
        reader = self.reader
        while reader.head is None:
            try:
                data = await self.stream.read(READ_SIZE)
            except ConnectionError as exc:
                raise UpstreamError("the engine closed the connection before answering") from exc
            if not data:
                raise UpstreamError("the engine closed the connection before answering")
            spans = reader.feed(data)
            if reader.invalid is not None and reader.head is None:  # an invalid body: chunks() says so
                raise UpstreamError("the engine sent an invalid response")
        self._first = body_of(spans, data)
        return reader.head

    async def chunks(self, idle: float | None = None) -> AsyncIterator[bytes]:
        """The body's data as it arrives: what one read holds is passed on together, so a burst of small
        SSE events costs one hand-over, not one each. Invalid framing is a ValueError, after the whole
        chunks before it; EngineIdle when nothing comes for `idle` seconds (None: no limit)."""
        reader = self.reader
        if self._first:
            first, self._first = self._first, b""
            yield first
        while reader.invalid is None and not reader.complete:
            data = await _within(idle, self.stream.read(READ_SIZE))
            if not data:
                if reader.feed_eof():
                    return
                raise UpstreamError("the engine closed the stream mid-response")
            out = body_of(reader.feed(data), data)
            if out:
                yield out
        if reader.invalid is not None:
            raise ValueError(reader.invalid)


async def get(
    socket: str, path: str, timeout: float = 2.0, max_body: int = 16 * 1024 * 1024
) -> tuple[int, bytes] | None:
    """(status, body) of a GET on a Unix socket, or None when nothing answers."""
    return await request(socket, "GET", path, timeout=timeout, max_body=max_body)


async def request(
    socket: str,
    method: str,
    path: str,
    body: bytes | None = None,
    timeout: float = 2.0,
    max_body: int = 16 * 1024 * 1024,
) -> tuple[int, bytes] | None:
    """(status, body) of a request (a JSON `body`, if any) on a Unix socket, or None when nothing answers
    within `timeout` seconds."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(socket, limit=MAX_HEAD), timeout)
    except (OSError, TimeoutError):
        return None
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        writer.write(head.encode() + b"\r\n" + (body or b""))
        await writer.drain()
        answer = Answer(reader)
        status = (await asyncio.wait_for(answer.read_head(), timeout)).status
        received = bytearray()
        async with asyncio.timeout(timeout):
            async for chunk in answer.chunks():
                received += chunk
                if len(received) > max_body:
                    break
        return status, bytes(received)
    except (OSError, TimeoutError, UpstreamError, ValueError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
