"""The HTTP front's engine side: connections to engines' Unix sockets, kept alive between requests
(`EnginePool`), each relaying one answer at a time to the client connection that asked (`Upstream`): the
head rewritten, the body passed on as read (by the one response reader, response_reader.py, which follows
it only far enough to know where it ends), and a chunked body handed to the C relay (native_relay.py) at a
chunk boundary. After a head the front sent early (a stream that waited: server/keepalive.py), which said
the body is chunked, a body the engine framed otherwise (by its length, or by closing) is framed anew as
chunks. The client side is server/front.py; it reaches this module only through `Client`."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from modelrunner import eventlog
from modelrunner.compat.context_overflow import refusal
from modelrunner.http1 import EngineIdle
from modelrunner.response_reader import ResponseReader, body_of
from modelrunner.scheduler.rundir import untrusted_socket
from modelrunner.server.errors import OPENAI, exception_payload
from modelrunner.server.keepalive import LAST_CHUNK, chunk
from modelrunner.server.native_relay import End, NativeRelay, Result, native_relay
from modelrunner.server.proxy import client_headers, retry_full_backlog, stream_end_event
from modelrunner.server.recorder import TAIL_KEPT
from modelrunner.wire import EVENT_END, tail_after

if TYPE_CHECKING:
    from modelrunner.server.lifecycle import Exchange
    from modelrunner.server.recorder import Record

log = logging.getLogger(__name__)

MAX_IDLE_SECONDS = 2.0  # an idle engine connection is reused within this, else closed
MAX_IDLE_PER_SOCKET = 512
# Refusals are held whole: the one engine-error mapping rewords them (context overflow), and a stream
# whose head went out early (server/keepalive.py) ends with them as its error event.
REFUSAL = 400
MAX_HELD = 64 * 1024


class Client(Protocol):
    """What an Upstream needs of the client connection it answers (server/front.py's FrontProtocol)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    write_paused: bool  # the client does not take what is written: the engine is not read either
    closing: bool  # close the client's connection once the answer is complete

    @property
    def early(self) -> bool:
        """Its head went out before the engine's (server/keepalive.py): a chunked body follows it."""
        ...

    upstream: Upstream | None  # the engine connection answering it, for flow control

    def answer_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes: ...

    def whole_answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes: ...

    def engine_silent(self, silent: bool) -> None: ...

    def silent_pings(self) -> tuple[bytes, float]: ...


class EnginePool:
    """Connections to engines' sockets kept alive between requests, as nginx's `keepalive` does: a request
    takes the connection that went idle last, or opens one. Only a connection whose answer was complete
    comes back (`Upstream.reusable`): never one whose client left mid-answer, one that
    failed, or one the engine asked to close; and one idle for MAX_IDLE_SECONDS is closed, well before
    engines close theirs (llama-server and uvicorn: 5 s).

    An engine that closes connections it said it would keep (llama-server b11434 closes every streamed
    answer's, its head saying `Keep-Alive: timeout=5, max=100`) has none kept any more: a request that
    took such a connection before its close was seen went out twice (written, dropped unanswered, sent
    again on a new connection), which 17 of 64 streams at c=1 did. Such an engine gets one connection
    opened ahead instead (`open_spare`): while it answers a request, the next one's connection is opened,
    off that request's path (the connect took ~0.2 ms of the first token's time at c=1). One per socket:
    llama-server's HTTP threads are its slots + 2, and a spare holds one of the two while it waits."""

    def __init__(self) -> None:
        self.idle: dict[str, list[Upstream]] = {}  # per socket, the last to go idle at the end
        self.not_kept: set[str] = set()  # sockets whose engine closes its connections after answers
        self._sweep: asyncio.TimerHandle | None = None
        self._opening: dict[str, asyncio.Task[None]] = {}  # a spare connection being opened, per socket

    def engine_closed(self, upstream: Upstream) -> None:
        """The engine closed a connection it had said it would keep (`Upstream.connection_lost`): none of
        that socket's are kept from now on."""
        self.lost(upstream)
        if upstream.socket not in self.not_kept:
            self.not_kept.add(upstream.socket)
            eventlog.event(log, "engine_connections_not_kept", socket=Path(upstream.socket).name)

    def take(self, socket: str) -> Upstream | None:
        idle = self.idle.get(socket)
        if idle:
            upstream = idle.pop()
            if time.monotonic() - upstream.idle_since < MAX_IDLE_SECONDS:
                return upstream
            upstream.close()  # the newest is too old: so are the rest, which the sweep closes
        return None

    async def connect(self, socket: str) -> Upstream:
        untrusted = untrusted_socket(Path(socket))
        if untrusted is not None:  # another user's socket would see (and answer) the prompt
            eventlog.event(log, "engine_socket_refused", logging.ERROR, reason=untrusted)
            raise PermissionError(untrusted)
        loop = asyncio.get_running_loop()
        _, upstream = await retry_full_backlog(
            lambda: loop.create_unix_connection(lambda: Upstream(self, socket), socket)
        )
        return upstream

    def give_back(self, upstream: Upstream) -> None:
        if upstream.socket in self.not_kept:
            upstream.close()
        else:
            self._keep(upstream)

    def _keep(self, upstream: Upstream) -> None:
        idle = self.idle.setdefault(upstream.socket, [])
        if len(idle) >= MAX_IDLE_PER_SOCKET:
            upstream.close()
            return
        upstream.idle_since = time.monotonic()
        idle.append(upstream)
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(MAX_IDLE_SECONDS, self._close_old)

    def open_spare(self, socket: str) -> None:
        """For an engine that keeps no connection: open one for the next request, unless one is open or
        being opened. It waits with the idle ones (closed after MAX_IDLE_SECONDS unused, or when the
        runner retires). A request sent on a spare the engine had closed goes again on a new connection,
        as one sent on a kept connection does (`Upstream.waited`)."""
        if socket not in self.not_kept or self.idle.get(socket) or socket in self._opening:
            return
        self._opening[socket] = asyncio.get_running_loop().create_task(self._spare(socket))

    async def _spare(self, socket: str) -> None:
        try:
            upstream = await self.connect(socket)
        except OSError:
            return  # the engine is going away: its next request connects itself, and is told
        finally:
            del self._opening[socket]
        if socket in self.not_kept:  # not since retired (close_idle)
            upstream.ahead = True
            self._keep(upstream)
        else:
            upstream.close()

    def close_idle(self, socket: str) -> None:
        """Close the idle connections to a socket whose engine is being stopped: it may wait for them (the
        next engine on that socket starts with a clean slate)."""
        self.not_kept.discard(socket)
        for upstream in self.idle.pop(socket, []):
            upstream.close()

    def lost(self, upstream: Upstream) -> None:
        """An idle connection the engine closed (its idle timeout, or it stopped)."""
        idle = self.idle.get(upstream.socket)
        if idle is not None and upstream in idle:
            idle.remove(upstream)
            if not idle:
                del self.idle[upstream.socket]

    def _close_old(self) -> None:
        self._sweep = None
        oldest = time.monotonic() - MAX_IDLE_SECONDS
        for socket, idle in list(self.idle.items()):
            old = 0
            while old < len(idle) and idle[old].idle_since <= oldest:
                old += 1
            for upstream in idle[:old]:
                upstream.close()
            del idle[:old]
            if not idle:
                del self.idle[socket]
        if self.idle:
            self._sweep = asyncio.get_running_loop().call_later(MAX_IDLE_SECONDS / 2, self._close_old)


@dataclass(eq=False)
class Relayed:
    """The answer an Upstream relays: made by begin(), its client let go by end(), kept after for the front
    to read its account (what was sent, how it ended)."""

    front: Client | None = None  # the client connection it answers, until end()
    client: asyncio.Transport | None = None  # that connection's transport
    exchange: Exchange | None = None
    record: Record | None = None
    idle: float = 0.0  # the engine's idle limit in the answer's body (0: none): see Upstream._idle_check
    finished: asyncio.Future[None] | None = None  # done when the answer is complete or the connection ends
    reader: ResponseReader = field(default_factory=ResponseReader)  # its head is passed on once whole
    heard: bool = False  # the engine sent something of its answer
    event_stream: bool = False
    failure: str | None = None
    sent: int = 0  # body bytes passed to the client
    native: int | None = None  # the C relay's stream, while it relays the body (native_relay.py)
    client_gone: bool = False  # the client closed while the C relay had the body
    native_refused: bool = False  # the C relay could not take this answer: no more tries
    last_read: float = 0.0  # time.monotonic() of the body's last bytes
    idle_timer: asyncio.TimerHandle | None = None
    held: bytearray | None = None  # the data of a refusal, held until whole (Upstream._reword)
    silent: bool = False  # a stream's head came without data: the front comments until its first bytes
    reframed: bool = False  # a body not chunked by the engine, after an early head: written as chunks
    tail: bytes = EVENT_END  # a reframed body's last bytes, to know whether an SSE event was cut


class Upstream(asyncio.Protocol):
    """A connection to an engine's socket (kept alive between requests by the EnginePool). While it
    carries a request, the engine's answer goes to the client as it arrives: the head rewritten, the body
    passed on as read, followed only far enough to know where it ends."""

    def __init__(self, pool: EnginePool, socket: str) -> None:
        self.pool = pool
        self.socket = socket
        self.transport: asyncio.Transport | None = None
        self.uses = 0
        self.idle_since = 0.0
        self.keep_alive = True  # the engine may take another request on this connection
        self.closed_here = False  # closed by the daemon (not the engine)
        self.ahead = False  # opened before a request needed it (EnginePool.open_spare)
        self.request = Relayed()  # the answer in progress, or the last one (for its account)

    def begin(self, front: Client, exchange: Exchange, message: bytes, idle: float) -> asyncio.Future[None]:
        """Send a request; the future is done when its answer is complete or the connection ends. `idle`:
        the engine's idle limit in the answer's body (0: none)."""
        assert self.transport is not None
        self.uses += 1
        finished = front.loop.create_future()
        self.request = Relayed(front, front.transport, exchange, exchange.record, idle, finished)
        front.upstream = self  # for flow control: a client that reads slowly pauses the engine
        if front.write_paused:
            self.transport.pause_reading()
        if self.transport.is_closing():
            finished.set_result(None)
        else:
            self.transport.write(message)
            self.pool.open_spare(self.socket)  # for an engine that keeps no connection
        return finished

    def end(self) -> None:
        """The request is over: the connection answers nobody until the next begin()."""
        self._stop_idle_timer()
        request, front = self.request, self.request.front
        if front is not None and front.upstream is self:
            front.upstream = None
        if front is not None and front.write_paused and self.transport is not None:
            self.transport.resume_reading()  # idle, it must notice when the engine closes it
        request.front = request.client = None
        request.exchange = request.record = None

    @property
    def waited(self) -> bool:
        """The connection was open before the request it carries (kept from an earlier one, or a spare):
        the engine may have closed it as the request went out."""
        return self.uses > 1 or self.ahead

    @property
    def vanished(self) -> bool:
        """The engine closed the connection before answering a byte."""
        request = self.request
        return not request.heard and request.failure is None

    @property
    def reusable(self) -> bool:
        request = self.request
        reader = request.reader
        return (
            self.keep_alive
            and reader.head is not None
            and reader.complete
            and not reader.until_close
            and request.failure is None
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def client_closed(self) -> None:
        """The client closed its connection while the C relay had the body: the relay's result says whether
        it had written the whole answer by then; the engine is told at once."""
        self.request.client_gone = True
        self.close()

    def close(self) -> None:
        request = self.request
        self.closed_here = True
        if request.native is not None:
            NativeRelay.cancel(request.native)  # its result ends the request: the relay may write till then
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        request = self.request
        reader = request.reader
        if request.client is None or reader.complete:
            # idle, or after its answer: an engine that speaks unasked is not trusted again
            self.keep_alive = False
            self.close()
            return
        request.heard = True
        head = b""
        start = 0
        new_head = reader.head is None
        if new_head:
            spans = reader.feed(data)
            if reader.head is None:
                if reader.invalid is not None:
                    self._invalid(ValueError(reader.invalid))
                return
            if reader.head.status >= REFUSAL and not reader.until_close:
                request.held = bytearray()
            else:
                assert request.front is not None
                request.reframed = request.front.early and not reader.chunked
                head = self._answer_head()
            start = reader.body_start
        else:
            if request.idle_timer is not None:
                request.last_read = time.monotonic()
            spans = reader.feed(data)
        if request.held is not None:
            self._reword(spans, data)
            return
        end = len(data) - reader.excess if reader.invalid is None else reader.valid
        if reader.excess:  # bytes after the answer: not the client's, and the connection is spoilt
            self.keep_alive = False
        body = data[start:end] if start or end < len(data) else data
        out = self._reframe(body) if request.reframed else body
        if head or out:
            assert request.client is not None and request.front is not None
            if request.silent and body:
                request.silent = False
                request.front.engine_silent(False)
            request.client.write(head + out if head else out)  # the head and the first bytes: one write
        chunks = reader.chunked or request.reframed  # comments can go between the client's chunks
        # llama-server sends a stream's head as its prefill starts: keep-alive comments go until its first
        # chunk (server/keepalive.py), written by the C relay when it takes the body from here
        prefill = new_head and not body and request.event_stream and chunks and not reader.complete
        if prefill:
            assert request.client is not None and request.front is not None
            if request.front.early:  # a seam: the early head's comments end, the prefill's follow at once
                request.client.write(request.front.silent_pings()[0])
        request.sent += len(body)
        if request.record is not None and spans:
            request.record.tee(body_of(spans, data))  # the data, unframed
        if reader.invalid is not None:
            self._invalid(ValueError(reader.invalid))
        elif reader.complete:
            self._answered()
        elif reader.chunked and reader.at_boundary and (body or prefill) and not request.native_refused:
            self._hand_to_native(pings=prefill)
        if prefill and request.native is None and reader.invalid is None:  # relayed here: the front pings
            request.silent = True
            assert request.front is not None
            request.front.engine_silent(True)

    def _reframe(self, body: bytes) -> bytes:
        """Body bytes of a reframed answer as the client's chunk, and its last chunk once it is complete."""
        request = self.request
        if body:
            request.tail = tail_after(request.tail, body)
        return (chunk(body) if body else b"") + (LAST_CHUNK if request.reader.complete else b"")

    def _end_reframed(self) -> None:
        """The engine's connection ended a reframed body: its end (a close-delimited body is complete), or,
        for a stream cut short, its error event first, as the front ends a cut chunked stream."""
        request, reader, exchange = self.request, self.request.reader, self.request.exchange
        if request.client is None or request.client.is_closing() or exchange is None:
            return
        if reader.complete and not exchange.aborted:  # a shutdown closes it too: not the body's end
            request.client.write(LAST_CHUNK)
            self._answered()
        elif request.event_stream:
            message = exchange.failure(request.failure or "connection closed")
            request.client.write(chunk(stream_end_event(request.tail, message)) + LAST_CHUNK)

    def _answer_head(self) -> bytes:
        """The head of the answer as the client gets it, once the engine's is whole."""
        request = self.request
        assert request.front is not None and request.reader.head is not None
        engine_head, reader = request.reader.head, request.reader
        # the body is passed on as the engine framed it: its Transfer-Encoding stays
        headers, request.event_stream = client_headers(engine_head.headers, reframed=False)
        self.keep_alive = engine_head.keep_alive
        if reader.until_close and not request.reframed:  # a body that ends at the close, and so ends ours
            request.front.closing = True
        if request.idle and not reader.complete:
            request.last_read = time.monotonic()
            request.idle_timer = request.front.loop.call_later(request.idle, self._idle_check)
        return request.front.answer_head(engine_head.status, headers)

    def _reword(self, spans: list[tuple[int, int]], data: bytes) -> None:
        """A refusal, held until whole, then written in OpenAI's shape when a prompt over the context is
        what it says (compat/context_overflow.py), else as the engine wrote it (its data, framed anew)."""
        request, reader = self.request, self.request.reader
        assert request.held is not None and reader.head is not None
        request.held += body_of(spans, data)
        if reader.invalid is not None or len(request.held) > MAX_HELD:
            self._invalid(ValueError(reader.invalid or "an error answer too large"))
            return
        if not reader.complete:
            return
        body = bytes(request.held)
        overflow = refusal(reader.head.status, body)
        if overflow is not None:
            body = json.dumps(exception_payload(OPENAI, overflow)).encode()
        self.keep_alive = reader.head.keep_alive and not reader.excess
        headers, _ = client_headers(reader.head.headers)  # without its framing: it is framed anew
        headers = [(k, v) for k, v in headers if k != b"content-length"]
        headers.append((b"content-length", b"%d" % len(body)))
        assert request.front is not None and request.client is not None
        request.client.write(request.front.whole_answer(reader.head.status, headers, body))
        request.sent += len(body)
        if request.record is not None:
            request.record.tee(body)
        self._answered()

    def _hand_to_native(self, pings: bool = False) -> None:
        """The rest of a chunked body goes from the engine to the client through the C relay, when the
        client has taken all that was written to it (the relay writes to its socket directly). `pings`: the
        engine has sent the head alone; until its first bytes the relay writes the front's comments."""
        request = self.request
        assert self.transport is not None and request.client is not None and request.front is not None
        if (
            request.front.write_paused
            or request.client.get_write_buffer_size()
            or request.client.is_closing()
            or self.transport.is_closing()
        ):
            return  # perhaps at the next chunk boundary
        relay = native_relay(request.front.loop)
        if relay is None:  # switched off, or not built: every chunk of this answer here
            request.native_refused = True
            return
        ping, ping_every = request.front.silent_pings() if pings else (b"", 0.0)
        try:
            request.native = relay.add(
                request.client.get_extra_info("socket").fileno(),
                self.transport.get_extra_info("socket").fileno(),
                request.reader.tail,
                request.record is not None,
                request.record.room if request.record is not None else 0,  # it keeps the data, unframed
                TAIL_KEPT,
                request.idle,
                self._native_done,
                ping,
                ping_every,
            )
        except (OSError, MemoryError) as exc:  # out of file descriptors: relayed here, as before
            log.warning("native relay refused a stream (%s): relayed in Python", exc)
            request.native_refused = True
            return
        self.transport.pause_reading()  # the relay reads the engine's socket from here on
        self._stop_idle_timer()  # the relay keeps the idle limit from here on

    def _native_done(self, result: Result) -> None:
        """The C relay ended the body: its account, then the request ends as if relayed here."""
        request = self.request
        request.native = None
        reader = request.reader
        reader.tail = result.tail
        request.sent += result.sent
        if request.record is not None:
            if request.record.first_data is None and result.first_data:  # handed over at the head
                request.record.first_data = result.first_data
            request.record.tee(result.recorded)
            request.record.tee(result.recorded_tail)
        if result.end is End.COMPLETE:
            reader.complete = True
            self.keep_alive = self.keep_alive and not result.excess
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()  # idle in the pool, it must notice when the engine closes it
            self._answered()
            return
        reader.broken = not result.at_boundary  # a chunk cut in the middle cannot be completed
        if result.end is End.INVALID:
            self._invalid(ValueError(result.invalid))
        elif result.end is End.ENGINE_IDLE:
            request.failure = str(EngineIdle(request.idle))
        if result.end is End.CLIENT_GONE or request.client_gone:
            if request.exchange is not None:
                request.exchange.client_left()
            if request.client is not None:
                request.client.abort()
        self.close()
        if request.finished is not None and not request.finished.done():
            request.finished.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        request = self.request
        if request.native is not None:
            return  # closed by us while the C relay has the body: its result ends the request
        if exc is None and request.failure is None:
            request.reader.feed_eof()  # the end of a body that ends with the connection
        if request.reframed and not (request.finished is None or request.finished.done()):
            self._end_reframed()
        finished = request.finished
        answered = finished is None or finished.done()  # idle, or its answer complete
        if finished is not None and not answered:
            finished.set_result(None)
        # a connection its answers said it would keep, closed by the engine after one (or as a request
        # went out on it again: the front sends that one once more)
        if self.keep_alive and not self.closed_here and (answered or (self.waited and self.vanished)):
            self.pool.engine_closed(self)
        elif answered:
            self.pool.lost(self)

    def _answered(self) -> None:
        """The whole answer is written to the client: complete now, even if the client, having read it,
        closes its connection before the relaying task resumes."""
        request = self.request
        assert request.finished is not None
        if request.exchange is not None:
            request.exchange.complete = True
        if not request.finished.done():
            request.finished.set_result(None)

    def _invalid(self, exc: ValueError) -> None:
        """Nothing of the invalid read is passed on; the client's answer ends as if the engine had closed
        there (the reader left the framing as it was before the invalid bytes)."""
        self.request.failure = f"the engine sent an invalid response ({exc})"
        assert self.transport is not None
        self.transport.abort()

    def _idle_check(self) -> None:
        """The engine's idle limit in the body of the answer relayed here: an engine that sends nothing
        for that long (while it is read: a client that does not read pauses it) ends the answer, as an
        engine that closed would, and its runner is released."""
        request = self.request
        request.idle_timer = None
        front, transport = request.front, self.transport
        if front is None or transport is None or request.native is not None or request.reader.head is None:
            return
        if request.reader.complete or request.failure is not None or transport.is_closing():
            return
        now = time.monotonic()
        if front.write_paused:
            request.last_read = now
        elif now - request.last_read >= request.idle:
            request.failure = str(EngineIdle(request.idle))
            transport.abort()
            return
        request.idle_timer = front.loop.call_later(request.last_read + request.idle - now, self._idle_check)

    def _stop_idle_timer(self) -> None:
        request = self.request
        if request.idle_timer is not None:
            request.idle_timer.cancel()
            request.idle_timer = None
