"""Just enough HTTP/1.1 to talk to engines on Unix sockets: response heads, bodies as they arrive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from modelrunner.chunking import MAX_CHUNK_LINE, chunk_size

READ_SIZE = 64 * 1024
MAX_HEAD = 64 * 1024
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


async def read_head(reader: asyncio.StreamReader) -> tuple[int, list[tuple[bytes, bytes]]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
        raise UpstreamError("the engine closed the connection before answering") from exc
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise UpstreamError("the engine sent an invalid response")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.strip().lower(), value.strip()))
    return int(parts[1]), headers


async def _dechunk(reader: asyncio.StreamReader, idle: float | None) -> AsyncIterator[bytes]:
    """Decode chunked transfer encoding from whatever has arrived: every complete chunk in one read is
    passed on together, so a burst of small SSE events costs one hand-over, not one each. Invalid framing
    is a ValueError, after the whole chunks before it."""
    buffer = bytearray()
    while True:
        out = bytearray()
        invalid: ValueError | None = None
        last = False  # the last chunk came
        try:
            while (line_end := buffer.find(b"\r\n", 0, MAX_CHUNK_LINE + 2)) >= 0:
                size = chunk_size(bytes(buffer[:line_end]))
                if size == 0:  # the last chunk; trailers, if any, are not needed
                    last = True
                    break
                start, end = line_end + 2, line_end + 2 + size
                if len(buffer) < end + 2:
                    break
                if buffer[end : end + 2] != b"\r\n":
                    raise ValueError("no CRLF after a chunk's data")
                out += buffer[start:end]
                del buffer[: end + 2]
            else:
                if len(buffer) > MAX_CHUNK_LINE:
                    raise ValueError("a chunk line is too long")
        except ValueError as exc:
            invalid = exc
        if out:
            yield bytes(out)
        if invalid is not None:
            raise invalid
        if last:
            return
        data = await _within(idle, reader.read(READ_SIZE))
        if not data:
            raise UpstreamError("the engine closed the stream mid-response")
        buffer += data


async def body_chunks(
    reader: asyncio.StreamReader, headers: list[tuple[bytes, bytes]], idle: float | None = None
) -> AsyncIterator[bytes]:
    """Yield the response body as it arrives: chunked, sized, or until the engine closes; EngineIdle when
    nothing comes for `idle` seconds."""
    values = dict(headers)
    if b"chunked" in values.get(b"transfer-encoding", b"").lower():
        async for data in _dechunk(reader, idle):
            yield data
    elif b"content-length" in values:
        remaining = int(values[b"content-length"])
        while remaining > 0:
            data = await _within(idle, reader.read(min(READ_SIZE, remaining)))
            if not data:
                raise UpstreamError("the engine closed the stream mid-response")
            remaining -= len(data)
            yield data
    else:
        while data := await _within(idle, reader.read(READ_SIZE)):
            yield data


async def get(
    socket: str, path: str, timeout: float = 2.0, max_body: int = 16 * 1024 * 1024
) -> tuple[int, bytes] | None:
    """(status, body) of a GET on a Unix socket, or None when nothing answers."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(socket, limit=MAX_HEAD), timeout)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status, headers = await asyncio.wait_for(read_head(reader), timeout)
        body = bytearray()
        async with asyncio.timeout(timeout):
            async for chunk in body_chunks(reader, headers):
                body += chunk
                if len(body) > max_body:
                    break
        return status, bytes(body)
    except (OSError, TimeoutError, UpstreamError, ValueError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
