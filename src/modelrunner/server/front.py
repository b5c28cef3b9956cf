"""The daemon's HTTP front: plain inference requests relayed byte for byte, everything else to uvicorn.

uvicorn creates one `FrontProtocol` per connection. It reads each request head itself; a plain inference
request (HTTP/1.1 POST to an inference route with a sized JSON body, an allowed Host, a valid key, no
Origin) is answered here: the scheduler gives a runner, the request goes to the engine's Unix socket and
the engine's answer comes back with only its head rewritten, its body (chunked or sized) passed on as it
arrives, without de-chunking or an ASGI hand-over per chunk. Any other request hands the connection to
uvicorn's own protocol and the full ASGI stack (security middleware, FastAPI, the same inference handler),
so refusals, CORS and every other route keep one implementation.

A connection's request in progress is one `Answering`, whose `Phase` says how much of its answer the
client has (nothing, an early head with keep-alive comments, or its own head).

Each request the front answers is an exchange of the request lifecycle (server/lifecycle.py), as on the
ASGI path: its id in the `X-Request-Id` header, its runner released when it ends, its engine connection
closed when the client leaves, its access line and its record. Answers that must be read whole (a
non-streamed llama.cpp generation, assembled from the stream asked for; embeddings, whose errors may be
reworded) go through server/served_call.py; all others are relayed byte for byte, by the
engine side of the front (server/engine_pool.py: kept-alive engine connections, each relaying one answer).

The protocol is built on uvicorn's (it hands connections over to `HttpToolsProtocol`, with the front's
rules about stalled requests and half-closes: server/handed_over.py): the uvicorn
releases it was tested with are pinned in pyproject.toml, and a test fails on any other.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, ClassVar, cast

from uvicorn.config import Config
from uvicorn.server import ServerState

from modelrunner import eventlog
from modelrunner.compat import structured
from modelrunner.errors import ModelRunnerError
from modelrunner.response_reader import MAX_HEAD
from modelrunner.server import fdlimit, keepalive
from modelrunner.server.engine_pool import EnginePool, Upstream
from modelrunner.server.errors import error_body
from modelrunner.server.handed_over import (
    REQUEST_STALL_SECONDS,
    HalfClose,
    HandedOver,
    asks_for_stream,
    stalled_answer,
    watch_half_close,
)
from modelrunner.server.inference import MAX_BODY, InferenceHandler, Prepared, error_parts, rescues_stream
from modelrunner.server.lifecycle import ClientGone, Exchange, Lifecycle
from modelrunner.server.proxy import (
    engine_died_body,
    request_bytes,
    stream_end_event,
)
from modelrunner.server.routes import Route, match_route
from modelrunner.server.security import SecurityPolicy
from modelrunner.server.upstream import EngineUnreachable, engine_idle_timeout

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

UVICORN_TESTED = ("0.54.",)  # the uvicorn releases this protocol was tested with (pyproject pins them)
REFUSED_LINGER = 2.0  # a connection refused for want of descriptors is closed after this at the latest
COMMENT_CHUNK = keepalive.chunk(keepalive.SSE_COMMENT)  # a keep-alive comment between a stream's chunks
_ALNUM = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_SAFE_TARGET = frozenset(_ALNUM + b"-._~/?=&+:,;")
_TOKEN = frozenset(_ALNUM + b"!#$%&'*+-.^_`|~")  # header names
_CONTROL = frozenset(range(32)) - {9} | {127}  # bytes no header value may hold (tab may)
_PAUSE_AT = 1024 * 1024  # bytes a client may send ahead while its previous request is answered


@dataclass(frozen=True)
class Request:
    path: str
    route: Route
    headers: list[tuple[bytes, bytes]]  # names in lower case
    content_length: int
    close: bool  # the client asked to close the connection after the answer


class Phase(enum.Enum):
    """How much of the answer to a request has gone out to the client."""

    WAITING = "waiting"  # nothing yet: a failure is answered whole, with its own status
    EARLY_HEAD = "early head"  # a 200 head and keep-alive comments, before the engine's head came (server/
    # keepalive.py): the engine's stream follows them, and a failure is the stream's last event
    HEAD_SENT = "head sent"  # the answer's head: only its body is left, or closing says it was cut


@dataclass(slots=True, eq=False)
class Answering:
    """The request a connection answers, from its whole body read to its exchange's end: one per request,
    so nothing of an answer outlives it."""

    request: Request
    body: bytes
    exchange: Exchange | None = None  # begun in the request's own task, whose context holds its id
    phase: Phase = Phase.WAITING
    pings: asyncio.TimerHandle | None = None  # the next early head or keep-alive comment

    @property
    def head_sent(self) -> bool:
        """The answer has begun with a head of its own (not an early one): a failure can only cut it."""
        return self.phase is Phase.HEAD_SENT

    def stop_pings(self) -> None:
        if self.pings is not None:
            self.pings.cancel()
            self.pings = None


@dataclass(frozen=True)
class FastPath:
    """Decides which requests the front answers itself, and finds their runner."""

    handler: InferenceHandler
    policy: SecurityPolicy
    lifecycle: Lifecycle
    pool: EnginePool = field(default_factory=lambda: EnginePool())
    max_connections: int = field(default_factory=fdlimit.max_connections)  # what the fd limit has room for
    engine_idle: float = field(default_factory=engine_idle_timeout)  # 0: no limit
    keepalive: float = field(default_factory=keepalive.interval)  # a waiting stream's pings (0: none)

    def accept(self, head: bytes) -> Request | None:
        """The request, if it is a plain inference request; None hands it to the full ASGI stack."""
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
            return None
        target = parts[1]
        if not target.startswith(b"/") or not _SAFE_TARGET.issuperset(target):
            return None  # percent-escapes and the like: uvicorn decodes them
        path = target.partition(b"?")[0].decode("ascii")
        route = match_route(path)
        if route is None:
            return None
        headers: list[tuple[bytes, bytes]] = []
        by_name: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if (
                not colon
                or not name
                or not _TOKEN.issuperset(name)
                or name.lower() in by_name
                or not _CONTROL.isdisjoint(value)
            ):
                return None  # malformed, folded or repeated headers, stray CR/LF/NUL: uvicorn answers those
            name, value = name.lower(), value.strip()
            headers.append((name, value))
            by_name[name] = value
        length = by_name.get(b"content-length", b"")
        host = by_name.get(b"host", b"").decode("latin-1")
        connection = by_name.get(b"connection", b"keep-alive").lower()
        if (
            not host.strip()  # an HTTP/1.1 request needs one: the ASGI stack answers 400
            or not length.isdigit()
            or int(length) > MAX_BODY
            or connection not in (b"keep-alive", b"close")
            or by_name.keys() & {b"transfer-encoding", b"expect", b"origin", b"upgrade", b"x-preload-only"}
            or not self.policy.host_allowed(host)
            or not self.policy.key_valid(by_name)
        ):
            return None
        return Request(path, route, headers, int(length), connection == b"close")


class FrontProtocol(asyncio.Protocol):
    """One client connection; made by uvicorn, with the constructor signature of its HTTP protocols."""

    fast: ClassVar[FastPath]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.answering: Answering | None = None  # the request being answered: the only state of one
        self.closing = False  # close once the current answer is complete
        self.write_paused = False
        self.read_paused = False
        self.upstream: Upstream | None = None  # the engine connection of the answer, for flow control
        self.half_close: HalfClose | None = None  # a local client's, while its whole answer is made
        self.timer: asyncio.TimerHandle | None = None
        self.refused = False  # no descriptors to spare for it: answered 503 (server/fdlimit.py)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        if len(self.server_state.connections) >= self.fast.max_connections:
            self._refuse_full()
            return
        self.server_state.connections.add(self)  # type: ignore[arg-type]  # uvicorn calls shutdown() only
        self._arm_timer(self.config.timeout_keep_alive)

    def data_received(self, data: bytes) -> None:
        if self.refused:  # its 503 is written: the request has been read, the descriptor goes
            if self.transport is not None:
                self.transport.close()
            return
        self.buffer += data
        if self.answering is None:
            # A request is arriving: it may take its time, as long as its bytes keep coming (uvicorn, too,
            # stops its keep-alive timer at a request's first byte).
            self._arm_timer(REQUEST_STALL_SECONDS)
            self._next_request()
        elif len(self.buffer) > _PAUSE_AT and not self.read_paused and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        self._cancel_timer()
        if self.half_close is not None:
            self.half_close.cancel()
        exchange = self.answering.exchange if self.answering is not None else None
        if exchange is None:
            return
        if self.upstream is not None and self.upstream.request.native is not None:
            self.upstream.client_closed()  # the C relay may have written the whole answer: its result says
        else:
            exchange.client_left()  # its engine connection closes: the engine stops generating

    def eof_received(self) -> bool | None:
        """The client shut its side while its request is answered: a half-close (the answer goes on) only
        when the client is on this machine and still holds its socket (watched until it lets go);
        otherwise it left, streamed or not, and its engine's work stops now (server/handed_over.py says
        why)."""
        answering = self.answering
        if answering is None or answering.exchange is None or self.transport is None:
            return None  # closed: connection_lost ends the request
        peer, local = self.transport.get_extra_info("peername"), self.transport.get_extra_info("sockname")
        self.half_close = watch_half_close(self.loop, peer, local, self.transport.close)
        if self.half_close is None:
            return None
        self.closing = True  # nothing more can come: close once answered
        return True

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None and upstream.request.native is None:
            upstream.request.last_read = time.monotonic()  # not read while paused: not idle either
            upstream.transport.resume_reading()

    def _refuse_full(self) -> None:
        """503 with Retry-After, before reading the request; then the write side is closed, and the
        connection once the request is read (closing with unread bytes would reset it, and the client could
        lose the answer), or after REFUSED_LINGER seconds."""
        assert self.transport is not None
        self.refused = True
        eventlog.event(
            log,
            "refused",
            logging.WARNING,
            status=503,
            reason="file_descriptors",
            max=self.fast.max_connections,
        )
        message = "the model runner has too many open connections; retry later"
        body = json.dumps(error_body(503, message)).encode()
        self.transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: %d\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%b"
            % (fdlimit.RETRY_AFTER, len(body), body)
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.timer = self.loop.call_later(REFUSED_LINGER, self.transport.close)
        else:
            self.transport.close()

    # uvicorn's server interface

    def shutdown(self) -> None:
        """Graceful shutdown: close when idle, or after the answer in progress."""
        self.closing = True
        if self.answering is None and self.transport is not None:
            self.transport.close()

    # requests

    def _next_request(self) -> None:
        assert self.transport is not None
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                self._hand_over()
            return
        request = self.fast.accept(bytes(self.buffer[:end]))
        if request is None:
            self._hand_over()
            return
        body_end = end + 4 + request.content_length
        if len(self.buffer) < body_end:
            return  # the rest of the body is on its way
        body = bytes(self.buffer[end + 4 : body_end])
        if structured.constrained(body) or rescues_stream(request.route, body):
            # its answer is checked, or its calls rescued, before it ends: the inference handler does that
            # (uvicorn reads the request again from the buffer)
            self._hand_over()
            return
        del self.buffer[:body_end]
        answering = self.answering = Answering(request, body)
        self.closing = self.closing or request.close
        self._cancel_timer()
        task = self.loop.create_task(self._answer(answering))
        self.server_state.tasks.add(task)
        task.add_done_callback(self.server_state.tasks.discard)

    def _hand_over(self) -> None:
        """From here on uvicorn serves this connection, starting with the bytes already read."""
        assert self.transport is not None
        self._cancel_timer()
        self.server_state.connections.discard(self)
        protocol = HandedOver(self.config, self.server_state, self.app_state, _loop=self.loop)
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        if self.write_paused:
            protocol.pause_writing()
        if self.buffer:
            data, self.buffer = bytes(self.buffer), bytearray()
            protocol.data_received(data)

    async def _answer(self, answering: Answering) -> None:
        assert self.transport is not None
        request, body = answering.request, answering.body
        lifecycle = self.fast.lifecycle
        exchange = answering.exchange = lifecycle.begin("POST", request.path, request.headers)
        exchange.keep_request(body)
        if self.fast.keepalive:  # a timer, not a parse: only a request that waits is looked at
            answering.pings = self.loop.call_later(self.fast.keepalive, self._ping, answering)
        try:
            await self._relay(answering, exchange)
        except asyncio.CancelledError:  # uvicorn's graceful shutdown ran out of time
            self.transport.close()
            raise
        except Exception:
            log.exception("inference request failed")
            if answering.phase is Phase.WAITING:
                self._write_json(500, json.dumps(error_body(500, "internal error")).encode())
            self.closing = True
        finally:
            answering.stop_pings()
            answering.exchange = None  # its end is the lifecycle's: the connection has no more to say
            await lifecycle.finish(exchange)
        self.answering = None
        if self.closing or self.transport.is_closing():
            self.transport.close()
            return
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        self._arm_timer(self.config.timeout_keep_alive)
        if self.buffer:
            self._arm_timer(REQUEST_STALL_SECONDS)
            self._next_request()

    async def _relay(self, answering: Answering, exchange: Exchange) -> None:
        request = answering.request
        try:
            prepared = await self.fast.handler.prepare(request.route, answering.body)
            if prepared.whole:
                await self._whole(prepared, request, exchange)
            else:
                await self._stream(prepared, request, exchange)
        except ModelRunnerError as exc:
            if answering.head_sent or exchange.client_gone or isinstance(exc, ClientGone):
                return
            status, payload, headers = error_parts(exc)
            self._write_json(status, json.dumps(payload).encode(), headers)

    async def _whole(self, prepared: Prepared, request: Request, exchange: Exchange) -> None:
        """An answer read whole from the engine (server/served_call.py), then written with its length."""
        call = prepared.call(exchange)
        try:
            await call.send(request.route.upstream_path, prepared.body, request.headers)
            status, answer = await call.answer()
        except EngineUnreachable as exc:
            self._write_json(502, json.dumps(error_body(502, exc.message)).encode())
            return
        except ModelRunnerError as exc:
            if not exchange.client_gone:
                self._write_json(500, engine_died_body(exc.message))
            return
        finally:
            await call.close()
        if not exchange.client_gone and self.transport is not None and not self.transport.is_closing():
            self._write_json(status, answer, content_type=b"application/json; charset=utf-8")

    async def _stream(self, prepared: Prepared, request: Request, exchange: Exchange) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return  # the client left while its model loaded
        message = request_bytes("POST", request.route.upstream_path, request.headers, prepared.body, True)
        socket = str(prepared.runner.socket)
        pool = self.fast.pool
        upstream = pool.take(socket)
        for attempt in range(2):
            if upstream is None:
                try:
                    upstream = await pool.connect(socket)
                except OSError:
                    self._write_json(502, json.dumps(error_body(502, "the engine is not reachable")).encode())
                    return
            try:
                forget = exchange.opened(upstream.close)  # a client that leaves closes it
            except ModelRunnerError:
                pool.give_back(upstream)  # it carried nothing
                raise
            try:
                await upstream.begin(self, exchange, message, self.fast.engine_idle)
            finally:
                forget()
                upstream.end()
                exchange.bytes_out += upstream.request.sent
                if upstream.reusable and self.fast.lifecycle.scheduler.serving(prepared.runner):
                    pool.give_back(upstream)
                else:
                    upstream.close()  # already closed, unless this task was cancelled
            if (
                attempt
                or not (upstream.waited and upstream.vanished)
                or exchange.client_gone
                or exchange.aborted
            ):
                break
            # A kept-alive or spare connection the engine closed just as the request went out (its idle
            # timeout, or an engine that closes after every answer): nothing was answered, so the request
            # goes once more, on a new connection.
            upstream = None
        assert upstream is not None
        self._finish(upstream, exchange)
        await exchange.release(prepared.runner)

    def _finish(self, upstream: Upstream, exchange: Exchange) -> None:
        """After the engine's answer ended (complete, or its connection closed): end the client's answer, as
        well as it can be ended."""
        assert self.transport is not None
        reader = upstream.request.reader
        if self.transport.is_closing():
            return  # the client left
        answering = self.answering
        if reader.head is None or answering is None or answering.phase is Phase.WAITING:
            # nothing of it written (a refusal held whole)
            message = exchange.failure(upstream.request.failure or "no response")
            self._write_json(500, engine_died_body(message))
        elif reader.until_close and not upstream.request.reframed:
            self.closing = (
                True  # the only end of such a body is the end of the connection (unless chunked anew)
            )
        elif not reader.complete:
            message = exchange.failure(upstream.request.failure or "connection closed")
            if upstream.request.event_stream and reader.chunked and reader.at_boundary:
                # the status is sent: say it in the stream (ending a half-sent event first), then end it
                event = stream_end_event(reader.tail, message)
                self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(event), event))
            else:
                self.closing = True  # the body cannot be completed: closing tells the client
        else:
            exchange.complete = True

    def _ping(self, answering: Answering) -> None:
        """A stream still waiting for its engine: its head (once), then a comment every interval."""
        answering.pings = None
        if answering.head_sent or self.transport is None or self.transport.is_closing():
            return
        if answering.phase is Phase.WAITING:
            if not asks_for_stream(answering.request.path, answering.body):
                return
            self.write_head(200, keepalive.EARLY_HEAD)
            answering.phase = Phase.EARLY_HEAD
        self._comment(answering)

    def _comment(self, answering: Answering) -> None:
        """A keep-alive comment (a chunk of its own, between the stream's), and the next in an interval."""
        answering.pings = None
        if self.transport is None or self.transport.is_closing():
            return
        self.write(COMMENT_CHUNK)
        answering.pings = self.loop.call_later(self.fast.keepalive, self._comment, answering)

    def silent_pings(self) -> tuple[bytes, float]:
        """What the C relay writes while the engine is silent, and how often: the comments engine_silent()
        would write (none where it would write none)."""
        if self.answering is None or not self.fast.keepalive:
            return b"", 0.0
        return COMMENT_CHUNK, self.fast.keepalive

    def engine_silent(self, silent: bool) -> None:
        """The engine's stream began without data (a prefill): comments until its first bytes."""
        answering = self.answering
        if answering is None:
            return
        answering.stop_pings()
        if silent and self.fast.keepalive:
            answering.pings = self.loop.call_later(self.fast.keepalive, self._comment, answering)

    def whole_answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
        """A whole answer (a refusal, mostly) as written: after an early head, the stream's error event."""
        answering = self.answering
        if answering is not None and answering.phase is Phase.EARLY_HEAD:
            answering.stop_pings()
            return keepalive.chunk(keepalive.error_event(body)) + keepalive.LAST_CHUNK
        return self.answer_head(status, headers) + body

    def write_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.write(self.answer_head(status, headers))

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    @property
    def early(self) -> bool:
        """The answer's head went out before the engine's (keep-alive comments): a chunked body follows."""
        return self.answering is not None and self.answering.phase is Phase.EARLY_HEAD

    def answer_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The head of the answer, with ours and the request id; from here on the answer has begun. After
        an early head (pings), nothing: the engine's stream, chunked, follows it."""
        answering = self.answering
        if answering is not None:
            answering.stop_pings()
            if answering.phase is Phase.EARLY_HEAD:
                return b""
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
        lines = [b"HTTP/1.1 %d %b" % (status, reason)]
        lines += [name + b": " + value for name, value in self.server_state.default_headers]
        lines += [name + b": " + value for name, value in headers]
        exchange = answering.exchange if answering is not None else None
        if exchange is not None:
            lines += [name + b": " + value for name, value in exchange.answer_headers]
            lines.append(eventlog.REQUEST_ID_HEADER + b": " + exchange.id.encode())
            exchange.started_answer(status, headers)
        if self.closing:
            lines.append(b"connection: close")
        if answering is not None:
            answering.phase = Phase.HEAD_SENT
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def _write_json(
        self,
        status: int,
        body: bytes,
        extra: list[tuple[bytes, bytes]] | None = None,
        content_type: bytes = b"application/json",
    ) -> None:
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        self.write(self.whole_answer(status, headers + (extra or []), body))
        exchange = self.answering.exchange if self.answering is not None else None
        if exchange is not None:
            exchange.answered(body, True)

    def _arm_timer(self, seconds: float) -> None:
        self._cancel_timer()
        self.timer = self.loop.call_later(seconds, self._timed_out)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        """Idle between requests (keep-alive expired), or a request whose bytes stopped coming."""
        self.timer = None
        if self.answering is not None or self.transport is None:
            return
        if self.buffer:
            self.closing = True
            self._write_json(408, stalled_answer())
        self.transport.close()


def protocol_class(fast: FastPath) -> type[FrontProtocol]:
    """The protocol class to give uvicorn (`http=`) for one daemon."""
    return type("FrontProtocol", (FrontProtocol,), {"fast": fast})
