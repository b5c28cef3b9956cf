"""The relay's per-chunk loop out of Python: the C thread of modelrunner/_relay.c, seen from the event loop.

The front (server/engine_pool.py) reads an engine's answer head (and what came with it) itself; from a
chunk boundary on, a chunked body goes to the C thread, which moves each chunk from the engine's socket to the
client's without waking Python, and reports once, when the body ends. Python then owns both sockets again
and ends the request as it always does. Where the extension is not built (no C compiler at install), or
MODEL_RUNNER_NATIVE_RELAY=0, the front relays every chunk in Python, as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from enum import IntEnum
from typing import NamedTuple

log = logging.getLogger(__name__)

try:
    from modelrunner import _relay
except ImportError:  # built at install (setup.py) where a C compiler and Python's headers are found
    _relay = None  # type: ignore[assignment]


class End(IntEnum):
    """How a relayed body ended (_relay.c's `enum end`)."""

    COMPLETE = 1  # the last chunk and the trailers came, and all of it was written
    ENGINE_CLOSED = 2  # the engine's connection ended before the body did
    ENGINE_ERROR = 3  # reading from the engine failed
    INVALID = 4  # the engine's framing was invalid: of that read, only the whole chunks before were written
    CLIENT_GONE = 5  # writing to the client failed
    CANCELLED = 6  # cancel() asked
    ENGINE_IDLE = 7  # the engine sent nothing for the stream's idle limit while it was read


class Result(NamedTuple):
    id: int
    end: End
    at_boundary: bool  # between chunks when it ended
    excess: bool  # the engine sent bytes after the body's end
    sent: int  # body bytes written to the client
    first_data: float  # time.monotonic() of the first body byte written (pings are not); 0 if none
    tail: bytes  # the last two data bytes parsed (ResponseReader.tail): all written when at_boundary
    recorded: bytes  # the first `head_limit` bytes of the body's data (unframed)
    recorded_tail: bytes  # the last `tail_limit` bytes of it after those
    invalid: str | None  # why the framing was invalid


class NativeRelay:
    """The C relay's results, taken on one event loop when its eventfd says some are ready."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        assert _relay is not None
        self.loop = loop
        self.done: dict[int, Callable[[Result], None]] = {}
        loop.add_reader(_relay.start(), self._take)

    def add(
        self,
        client_fd: int,
        engine_fd: int,
        tail: bytes,
        record: bool,
        head_limit: int,
        tail_limit: int,
        idle: float,
        done: Callable[[Result], None],
        ping: bytes = b"",
        ping_every: float = 0.0,
    ) -> int:
        """Relay the chunked body from `engine_fd` to `client_fd` (neither is read or written by anyone
        else until `done` is called, on the loop); returns the stream's id for cancel(). An engine that
        sends nothing for `idle` seconds (0: no limit) while it is read ends the stream (ENGINE_IDLE).
        Until the engine's first bytes, `ping` (a whole chunk) goes to the client every `ping_every`
        seconds (a stream handed over at its head, before a prefill's end)."""
        client, engine = os.dup(client_fd), os.dup(engine_fd)  # the relay closes its own copies
        try:
            stream = _relay.add(client, engine, tail, record, head_limit, tail_limit, idle, ping, ping_every)
        except BaseException:
            os.close(client)
            os.close(engine)
            raise
        self.done[stream] = done
        return stream

    @staticmethod
    def cancel(stream: int) -> None:
        """End a stream now; its `done` is still called, with CANCELLED unless it had ended already."""
        _relay.cancel(stream)

    def cancel_all(self) -> None:
        for stream in self.done:
            _relay.cancel(stream)

    def _take(self) -> None:
        for item in _relay.results():
            result = Result(item[0], End(item[1]), bool(item[2]), bool(item[3]), *item[4:])
            done = self.done.pop(result.id, None)
            if done is None:
                continue
            try:
                done(result)
            except Exception as exc:  # the others' requests must still end
                context = {"message": "native relay: a stream's end failed", "exception": exc}
                self.loop.call_exception_handler(context)


_relay_of_loop: NativeRelay | None = None
_start_failed = False


def native_relay(loop: asyncio.AbstractEventLoop) -> NativeRelay | None:
    """The relay for this event loop, or None where the front must relay in Python: the extension is
    missing, MODEL_RUNNER_NATIVE_RELAY=0, or another loop of this process, still open, has it (the C
    thread reports to one loop)."""
    global _relay_of_loop, _start_failed
    if _relay is None or _start_failed or os.environ.get("MODEL_RUNNER_NATIVE_RELAY", "1") == "0":
        return None
    relay = _relay_of_loop
    if relay is not None and relay.loop is loop:
        return relay
    if relay is not None and not relay.loop.is_closed():
        return None
    if relay is not None and relay.done:
        log.warning("native relay: %d streams of a closed event loop are cancelled", len(relay.done))
        relay.cancel_all()
    try:
        _relay_of_loop = NativeRelay(loop)
    except OSError as exc:  # no thread or descriptors for it: every stream is relayed in Python
        log.warning("native relay: not started (%s): streams are relayed in Python", exc)
        _start_failed = True
        return None
    return _relay_of_loop
