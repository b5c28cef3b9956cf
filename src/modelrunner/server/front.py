"""The daemon's HTTP front: plain inference requests relayed byte for byte, everything else to uvicorn.

uvicorn creates one `FrontProtocol` per connection. It reads each request head itself; a plain inference
request (HTTP/1.1 POST to an inference route with a sized JSON body, an allowed Host, a valid key, no
Origin) is answered here: the scheduler gives a runner, the request goes to the engine's Unix socket and
the engine's answer comes back with only its head rewritten, its body (chunked or sized) passed on as it
arrives, without de-chunking or an ASGI hand-over per chunk. Any other request hands the connection to
uvicorn's own protocol and the full ASGI stack (security middleware, FastAPI, the same inference handler),
so refusals, CORS and every other route keep one implementation.

Each request the front answers is an exchange of the request lifecycle (server/lifecycle.py), as on the
ASGI path: its id in the `X-Request-Id` header, its runner released when it ends, its engine connection
closed when the client leaves, its access line and its record. Answers that must be read whole (a
non-streamed llama.cpp generation, assembled from the stream asked for; embeddings, whose errors may be
reworded) go through the engine call of server/upstream.py; all others are relayed byte for byte.

The protocol is built on uvicorn's (it hands connections over to `HttpToolsProtocol`, with the front's
rules about stalled requests and half-closes: server/handed_over.py): the uvicorn
releases it was tested with are pinned in pyproject.toml, and a test fails on any other.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from uvicorn.config import Config
from uvicorn.server import ServerState

from modelrunner import eventlog
from modelrunner.errors import ModelRunnerError
from modelrunner.http1 import EngineIdle
from modelrunner.response_reader import MAX_HEAD, ResponseReader, body_of
from modelrunner.scheduler.rundir import untrusted_socket
from modelrunner.server import fdlimit
from modelrunner.server.errors import error_body
from modelrunner.server.handed_over import (
    REQUEST_STALL_SECONDS,
    HalfClose,
    HandedOver,
    asks_for_stream,
    stalled_answer,
    watch_half_close,
)
from modelrunner.server.inference import MAX_BODY, InferenceHandler, Prepared, Route, error_parts, match_route
from modelrunner.server.lifecycle import ClientGone, Exchange, Lifecycle
from modelrunner.server.native_relay import End, NativeRelay, Result, native_relay
from modelrunner.server.proxy import (
    client_headers,
    engine_died_body,
    request_bytes,
    retry_full_backlog,
    stream_end_event,
)
from modelrunner.server.recorder import TAIL_KEPT
from modelrunner.server.security import SecurityPolicy
from modelrunner.server.upstream import EngineCall, EngineUnreachable, engine_idle_timeout

if TYPE_CHECKING:
    from modelrunner.server.recorder import Record

log = logging.getLogger(__name__)

UVICORN_TESTED = ("0.54.",)  # the uvicorn releases this protocol was tested with (pyproject pins them)
REFUSED_LINGER = 2.0  # a connection refused for want of descriptors is closed after this at the latest
_ALNUM = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_SAFE_TARGET = frozenset(_ALNUM + b"-._~/?=&+:,;")
_TOKEN = frozenset(_ALNUM + b"!#$%&'*+-.^_`|~")  # header names
_CONTROL = frozenset(range(32)) - {9} | {127}  # bytes no header value may hold (tab may)
_PAUSE_AT = 1024 * 1024  # bytes a client may send ahead while its previous request is answered
MAX_IDLE_SECONDS = 2.0  # an idle engine connection is reused within this, else closed
MAX_IDLE_PER_SOCKET = 512


@dataclass(frozen=True)
class Request:
    path: str
    route: Route
    headers: list[tuple[bytes, bytes]]  # names in lower case
    content_length: int
    close: bool  # the client asked to close the connection after the answer


@dataclass(frozen=True)
class FastPath:
    """Decides which requests the front answers itself, and finds their runner."""

    handler: InferenceHandler
    policy: SecurityPolicy
    lifecycle: Lifecycle
    pool: EnginePool = field(default_factory=lambda: EnginePool())
    max_connections: int = field(default_factory=fdlimit.max_connections)  # what the fd limit has room for
    engine_idle: float = field(default_factory=engine_idle_timeout)  # 0: no limit

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
        self.busy = False  # a request is being answered
        self.head_sent = False  # of the answer in progress
        self.closing = False  # close once the current answer is complete
        self.write_paused = False
        self.read_paused = False
        self.upstream: Upstream | None = None
        self.exchange: Exchange | None = None  # of the request being answered
        self.answering: tuple[str, bytes] | None = None  # its path and body
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
        if not self.busy:
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
        if self.exchange is None:
            return
        if self.upstream is not None and self.upstream.native is not None:
            self.upstream.client_closed()  # the C relay may have written the whole answer: its result says
        else:
            self.exchange.client_left()  # its engine connection closes: the engine stops generating

    def eof_received(self) -> bool | None:
        """The client shut its side: while its request for a stream is answered, a half-close (the answer
        goes on; a full close is seen when a write fails); for a whole answer, only when the client is on
        this machine and still holds its socket (watched until it lets go); otherwise it left
        (server/handed_over.py says why)."""
        if self.answering is None or self.transport is None:
            return None  # closed: connection_lost ends the request
        if not asks_for_stream(*self.answering):
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
        if self.upstream is not None and self.upstream.transport is not None and self.upstream.native is None:
            self.upstream.last_read = time.monotonic()  # not read while paused: not idle either
            self.upstream.transport.resume_reading()

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
        if not self.busy and self.transport is not None:
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
        del self.buffer[:body_end]
        self.busy = True
        self.closing = self.closing or request.close
        self._cancel_timer()
        task = self.loop.create_task(self._answer(request, body))
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

    async def _answer(self, request: Request, body: bytes) -> None:
        assert self.transport is not None
        self.head_sent = False
        lifecycle = self.fast.lifecycle
        exchange = self.exchange = lifecycle.begin("POST", request.path, request.headers)
        exchange.keep_request(body)
        self.answering = request.path, body
        try:
            await self._relay(request, body, exchange)
        except asyncio.CancelledError:  # uvicorn's graceful shutdown ran out of time
            self.transport.close()
            raise
        except Exception:
            log.exception("inference request failed")
            if not self.head_sent:
                self._write_json(500, json.dumps(error_body(500, "internal error")).encode())
            self.closing = True
        finally:
            self.exchange = self.answering = None
            await lifecycle.finish(exchange)
        self.busy = False
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

    async def _relay(self, request: Request, body: bytes, exchange: Exchange) -> None:
        try:
            prepared = await self.fast.handler.prepare(request.route, body)
            if prepared.whole:
                await self._whole(prepared, request, exchange)
            else:
                await self._stream(prepared, request, exchange)
        except ModelRunnerError as exc:
            if self.head_sent or exchange.client_gone or isinstance(exc, ClientGone):
                return
            status, payload, headers = error_parts(exc)
            self._write_json(status, json.dumps(payload).encode(), headers)

    async def _whole(self, prepared: Prepared, request: Request, exchange: Exchange) -> None:
        """An answer read whole from the engine (server/upstream.py), then written with its length."""
        call = EngineCall(exchange, prepared.runner)
        call.assembling = prepared.assembling
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
                await upstream.begin(self, exchange, message)
            finally:
                forget()
                upstream.end()
                exchange.bytes_out += upstream.sent
                if upstream.reusable and self.fast.lifecycle.scheduler.serving(prepared.runner):
                    pool.give_back(upstream)
                else:
                    upstream.close()  # already closed, unless this task was cancelled
            reused = upstream.uses > 1
            if attempt or not (reused and upstream.vanished) or exchange.client_gone or exchange.aborted:
                break
            # A kept-alive connection the engine closed just as the request went out (its idle timeout):
            # nothing was answered, so the request goes once more, on a new connection.
            upstream = None
        assert upstream is not None
        self._finish(upstream, exchange)
        await exchange.release(prepared.runner)

    def _finish(self, upstream: Upstream, exchange: Exchange) -> None:
        """After the engine's answer ended (complete, or its connection closed): end the client's answer, as
        well as it can be ended."""
        assert self.transport is not None
        reader = upstream.reader
        if self.transport.is_closing():
            return  # the client left
        if reader.head is None:
            message = exchange.failure(upstream.failure or "no response")
            self._write_json(500, engine_died_body(message))
        elif reader.until_close:
            self.closing = True  # the only end of such a body is the end of the connection
        elif not reader.complete:
            message = exchange.failure(upstream.failure or "connection closed")
            if upstream.event_stream and reader.chunked and reader.at_boundary:
                # the status is sent: say it in the stream (ending a half-sent event first), then end it
                event = stream_end_event(reader.tail, message)
                self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(event), event))
            else:
                self.closing = True  # the body cannot be completed: closing tells the client
        else:
            exchange.complete = True

    def write_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.write(self.answer_head(status, headers))

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def answer_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The head of the answer, with ours and the request id; from here on the answer has begun."""
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
        lines = [b"HTTP/1.1 %d %b" % (status, reason)]
        lines += [name + b": " + value for name, value in self.server_state.default_headers]
        lines += [name + b": " + value for name, value in headers]
        if self.exchange is not None:
            lines.append(eventlog.REQUEST_ID_HEADER + b": " + self.exchange.id.encode())
            self.exchange.started_answer(status, headers)
        if self.closing:
            lines.append(b"connection: close")
        self.head_sent = True
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def _write_json(
        self,
        status: int,
        body: bytes,
        extra: list[tuple[bytes, bytes]] | None = None,
        content_type: bytes = b"application/json",
    ) -> None:
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        self.write_head(status, headers + (extra or []))
        assert self.transport is not None
        self.transport.write(body)
        if self.exchange is not None:
            self.exchange.answered(body, True)

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
        if self.busy or self.transport is None:
            return
        if self.buffer:
            self.closing = True
            self._write_json(408, stalled_answer())
        self.transport.close()


class EnginePool:
    """Connections to engines' sockets kept alive between requests, as nginx's `keepalive` does: a request
    takes the connection that went idle last, or opens one. Only a connection whose answer was complete
    comes back (server/front.py's `Upstream.reusable`): never one whose client left mid-answer, one that
    failed, or one the engine asked to close; and one idle for MAX_IDLE_SECONDS is closed, well before
    engines close theirs (llama-server and uvicorn: 5 s)."""

    def __init__(self) -> None:
        self.idle: dict[str, list[Upstream]] = {}  # per socket, the last to go idle at the end
        self._sweep: asyncio.TimerHandle | None = None

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
        idle = self.idle.setdefault(upstream.socket, [])
        if len(idle) >= MAX_IDLE_PER_SOCKET:
            upstream.close()
            return
        upstream.idle_since = time.monotonic()
        idle.append(upstream)
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(MAX_IDLE_SECONDS, self._close_old)

    def close_idle(self, socket: str) -> None:
        """Close the idle connections to a socket whose engine is being stopped: it may wait for them."""
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
        # the request in progress: set by begin(), cleared by end()
        self.front: FrontProtocol | None = None
        self.client: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.record: Record | None = None
        self.reader = ResponseReader()  # of the answer: its head is passed on once whole
        self.heard = False  # the engine sent something of its answer
        self.event_stream = False
        self.keep_alive = True  # the engine may take another request on this connection
        self.failure: str | None = None
        self.sent = 0  # body bytes passed to the client
        self.finished: asyncio.Future[None] | None = None
        self.native: int | None = None  # the C relay's stream, while it relays the body (native_relay.py)
        self.client_gone = False  # the client closed while the C relay had the body
        self.native_refused = False  # the C relay could not take this answer: no more tries
        self.idle = 0.0  # the engine's idle limit in the answer's body (0: none): see _idle_check
        self.last_read = 0.0  # time.monotonic() of the body's last bytes
        self.idle_timer: asyncio.TimerHandle | None = None

    def begin(self, front: FrontProtocol, exchange: Exchange, request: bytes) -> asyncio.Future[None]:
        """Send a request; the future is done when its answer is complete or the connection ends."""
        assert self.transport is not None
        self.uses += 1
        self.front, self.client = front, front.transport
        self.exchange, self.record = exchange, exchange.record
        self.reader = ResponseReader()
        self.heard = False
        self.event_stream = False
        self.failure = None
        self.sent = 0
        self.client_gone = False
        self.native_refused = False
        self.idle = front.fast.engine_idle
        finished = self.finished = front.loop.create_future()
        front.upstream = self  # for flow control: a client that reads slowly pauses the engine
        if front.write_paused:
            self.transport.pause_reading()
        if self.transport.is_closing():
            finished.set_result(None)
        else:
            self.transport.write(request)
        return finished

    def end(self) -> None:
        """The request is over: the connection answers nobody until the next begin()."""
        self._stop_idle_timer()
        if self.front is not None and self.front.upstream is self:
            self.front.upstream = None
        if self.front is not None and self.front.write_paused and self.transport is not None:
            self.transport.resume_reading()  # idle, it must notice when the engine closes it
        self.front = self.client = None
        self.exchange = self.record = None

    @property
    def vanished(self) -> bool:
        """The engine closed the connection before answering a byte."""
        return not self.heard and self.failure is None

    @property
    def reusable(self) -> bool:
        reader = self.reader
        return (
            self.keep_alive
            and reader.head is not None
            and reader.complete
            and not reader.until_close
            and self.failure is None
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def client_closed(self) -> None:
        """The client closed its connection while the C relay had the body: the relay's result says whether
        it had written the whole answer by then; the engine is told at once."""
        self.client_gone = True
        self.close()

    def close(self) -> None:
        if self.native is not None:
            NativeRelay.cancel(self.native)  # its result ends the request: the relay may be writing till then
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        if self.client is None or reader.complete:
            # idle, or after its answer: an engine that speaks unasked is not trusted again
            self.keep_alive = False
            self.close()
            return
        self.heard = True
        head = b""
        start = 0
        if reader.head is None:
            spans = reader.feed(data)
            if reader.head is None:
                if reader.invalid is not None:
                    self._invalid(ValueError(reader.invalid))
                return
            head = self._answer_head()
            start = reader.body_start
        else:
            if self.idle_timer is not None:
                self.last_read = time.monotonic()
            spans = reader.feed(data)
        end = len(data) - reader.excess if reader.invalid is None else reader.valid
        if reader.excess:  # bytes after the answer: not the client's, and the connection is spoilt
            self.keep_alive = False
        body = data[start:end] if start or end < len(data) else data
        if head or body:
            assert self.client is not None
            self.client.write(head + body if head else body)  # the head and the first bytes: one write
        self.sent += len(body)
        if self.record is not None and spans:
            self.record.tee(body_of(spans, data))  # the data, unframed
        if reader.invalid is not None:
            self._invalid(ValueError(reader.invalid))
        elif reader.complete:
            self._answered()
        elif reader.chunked and reader.at_boundary and body and not self.native_refused:
            self._hand_to_native()

    def _answer_head(self) -> bytes:
        """The head of the answer as the client gets it, once the engine's is whole."""
        assert self.front is not None and self.reader.head is not None
        engine_head, reader = self.reader.head, self.reader
        headers, self.event_stream = client_headers(engine_head.headers, reframed=False)  # passed on framed
        self.keep_alive = engine_head.keep_alive
        if reader.until_close:
            self.front.closing = True
        if self.idle and not reader.complete:
            self.last_read = time.monotonic()
            self.idle_timer = self.front.loop.call_later(self.idle, self._idle_check)
        return self.front.answer_head(engine_head.status, headers)

    def _hand_to_native(self) -> None:
        """The rest of a chunked body goes from the engine to the client through the C relay, when the
        client has taken all that was written to it (the relay writes to its socket directly)."""
        assert self.transport is not None and self.client is not None and self.front is not None
        if (
            self.front.write_paused
            or self.client.get_write_buffer_size()
            or self.client.is_closing()
            or self.transport.is_closing()
        ):
            return  # perhaps at the next chunk boundary
        relay = native_relay(self.front.loop)
        if relay is None:  # switched off, or not built: every chunk of this answer here
            self.native_refused = True
            return
        try:
            self.native = relay.add(
                self.client.get_extra_info("socket").fileno(),
                self.transport.get_extra_info("socket").fileno(),
                self.reader.tail,
                self.record is not None,
                self.record.room if self.record is not None else 0,  # it keeps the data, unframed
                TAIL_KEPT,
                self.idle,
                self._native_done,
            )
        except (OSError, MemoryError) as exc:  # out of file descriptors: relayed here, as before
            log.warning("native relay refused a stream (%s): relayed in Python", exc)
            self.native_refused = True
            return
        self.transport.pause_reading()  # the relay reads the engine's socket from here on
        self._stop_idle_timer()  # the relay keeps the idle limit from here on

    def _native_done(self, result: Result) -> None:
        """The C relay ended the body: its account, then the request ends as if relayed here."""
        self.native = None
        reader = self.reader
        reader.tail = result.tail
        self.sent += result.sent
        if self.record is not None:  # its first_data was set by the bytes relayed here before the hand-off
            self.record.tee(result.recorded)
            self.record.tee(result.recorded_tail)
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
            self.failure = str(EngineIdle(self.idle))
        if result.end is End.CLIENT_GONE or self.client_gone:
            if self.exchange is not None:
                self.exchange.client_left()
            if self.client is not None:
                self.client.abort()
        self.close()
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.native is not None:
            return  # closed by us while the C relay has the body: its result ends the request
        if exc is None and self.failure is None:
            self.reader.feed_eof()  # the end of a body that ends with the connection
        if self.finished is None or self.finished.done():
            self.pool.lost(self)  # idle
        else:
            self.finished.set_result(None)

    def _answered(self) -> None:
        """The whole answer is written to the client: complete now, even if the client, having read it,
        closes its connection before the relaying task resumes."""
        assert self.finished is not None
        if self.exchange is not None:
            self.exchange.complete = True
        if not self.finished.done():
            self.finished.set_result(None)

    def _invalid(self, exc: ValueError) -> None:
        """Nothing of the invalid read is passed on; the client's answer ends as if the engine had closed
        there (the reader left the framing as it was before the invalid bytes)."""
        self.failure = f"the engine sent an invalid response ({exc})"
        assert self.transport is not None
        self.transport.abort()

    def _idle_check(self) -> None:
        """The engine's idle limit in the body of the answer relayed here: an engine that sends nothing
        for that long (while it is read: a client that does not read pauses it) ends the answer, as an
        engine that closed would, and its runner is released."""
        self.idle_timer = None
        front, transport = self.front, self.transport
        if front is None or transport is None or self.native is not None or self.reader.head is None:
            return
        if self.reader.complete or self.failure is not None or transport.is_closing():
            return
        now = time.monotonic()
        if front.write_paused:
            self.last_read = now
        elif now - self.last_read >= self.idle:
            self.failure = str(EngineIdle(self.idle))
            transport.abort()
            return
        self.idle_timer = front.loop.call_later(self.last_read + self.idle - now, self._idle_check)

    def _stop_idle_timer(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None


def protocol_class(fast: FastPath) -> type[FrontProtocol]:
    """The protocol class to give uvicorn (`http=`) for one daemon."""
    return type("FrontProtocol", (FrontProtocol,), {"fast": fast})
