"""Feed an async request body to blocking code (tarfile) running in a worker thread, with back-pressure."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Callable
from typing import IO, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream

T = TypeVar("T")


class _ThreadReader(io.RawIOBase):
    """A file-like object whose reads pull chunks from the event loop's memory stream."""

    def __init__(self, receive: MemoryObjectReceiveStream[bytes]) -> None:
        self._receive = receive
        self._pending = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending and not self._eof:
            try:
                self._pending = anyio.from_thread.run(self._receive.receive)
            except anyio.EndOfStream:
                self._eof = True
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


async def consume_in_thread(body: AsyncIterator[bytes], consumer: Callable[[IO[bytes]], T]) -> T:
    """Run `consumer(reader)` in a thread while the body streams into `reader`; at most 16 chunks buffered."""
    send, receive = anyio.create_memory_object_stream[bytes](16)
    result: list[T] = []

    async def produce() -> None:
        async with send:
            async for chunk in body:
                if chunk:
                    await send.send(chunk)

    async def consume() -> None:
        try:
            with receive:
                reader: IO[bytes] = io.BufferedReader(_ThreadReader(receive), buffer_size=1024 * 1024)
                result.append(await anyio.to_thread.run_sync(consumer, reader))
        except Exception as exc:
            errors.append(exc)
        finally:
            tasks.cancel_scope.cancel()  # the consumer is done: stop reading the body

    errors: list[Exception] = []
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(produce)
            tasks.start_soon(consume)
    except BaseExceptionGroup as group:  # the body stream failed (client went away): surface that error
        raise group.exceptions[0] from None
    if errors:
        raise errors[0]
    return result[0]
