"""uvicorn's HTTP protocol for the connections the HTTP front (server/front.py) hands to the ASGI stack, with
two of the front's own rules about the client's side of a connection:

* a request whose bytes stop coming for REQUEST_STALL_SECONDS (its head, or its body after a head that
  announced one) is answered 408 and its connection closed: uvicorn alone would wait for the rest forever.
  Time in which the application does not read the body (uvicorn stops reading the socket then, or has not
  yet sent the `100 Continue` the client waits for) is not the client's: the wait starts again when it reads.
* a client that shuts its side of the connection (EOF) while its request is answered: a half-close and a
  full close look the same until a write fails, and before the first token nothing may be written for
  minutes (a whole answer; a stream's prefill, between keep-alives), so a client that closed (its own
  timeout, say) would hold its runner and its engine's work for nobody, the very thing the disconnect tests
  (tests/integration/test_disconnect.py, test_prefill_cancel.py) forbid. So EOF is a half-close only for a
  client on this machine that still holds its socket (server/localuser.py reads that from the kernel),
  watched every HALF_CLOSE_CHECK_SECONDS until it lets go or is answered (`watch_half_close`); for any
  other client EOF means it left, streamed or not, as DMR (Go's net/http) and nginx take it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, cast

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from modelrunner.server.errors import error_body
from modelrunner.server.localuser import client_holds_socket
from modelrunner.server.routes import family_of

HALF_CLOSE_CHECK_SECONDS = 1.0  # how often a half-closed client of a whole answer is looked at again
REQUEST_STALL_SECONDS = 60.0  # a request whose bytes stop coming for this long is answered 408
STALLED = "the request was not received in full: its bytes stopped coming"
ABSOLUTE_FORM = "modelrunner.absolute_form"  # a scope key: the request's target was a whole URL


def stalled_answer() -> bytes:
    """The 408's JSON body."""
    return json.dumps(error_body(408, STALLED)).encode()


def asks_for_stream(path: str, body: bytes | bytearray) -> bool:
    """Whether a request asked for a streamed answer: its JSON body's `stream`, else its API's default
    (server/routes.py: Ollama's requests stream unless told not to; the other APIs answer whole)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None
    stream = doc.get("stream") if isinstance(doc, dict) else None
    return stream if isinstance(stream, bool) else family_of(path).streams_by_default


class HalfClose:
    """A local client that shut its side after asking for a whole answer: `gone` is called once it lets go
    of its socket (it closed: it left); `cancel()` when the connection ends first."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        client: tuple[str, int],
        server: tuple[str, int],
        gone: Callable[[], None],
    ) -> None:
        self.loop, self.client, self.server, self.gone = loop, client, server, gone
        self.timer: asyncio.TimerHandle | None = loop.call_later(HALF_CLOSE_CHECK_SECONDS, self._check)

    def _check(self) -> None:
        if client_holds_socket(self.client, self.server):
            self.timer = self.loop.call_later(HALF_CLOSE_CHECK_SECONDS, self._check)
        else:
            self.timer = None
            self.gone()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def watch_half_close(
    loop: asyncio.AbstractEventLoop, client: Any, server: Any, gone: Callable[[], None]
) -> HalfClose | None:
    """At EOF after a request for a whole answer: a watch when the client is on this machine and still holds
    its socket (a half-close), else None (it left)."""
    if not (
        isinstance(client, tuple) and isinstance(server, tuple) and len(client) >= 2 and len(server) >= 2
    ):
        return None  # a Unix socket: no owner of the other end to look at
    client, server = (str(client[0]), int(client[1])), (str(server[0]), int(server[1]))
    if not client_holds_socket(client, server):
        return None
    return HalfClose(loop, client, server, gone)


class _Flow(FlowControl):
    """uvicorn's flow control, telling the protocol when the application reads the body again."""

    def __init__(self, transport: asyncio.Transport, resumed: Any) -> None:
        super().__init__(transport)
        self._resumed = resumed

    def resume_reading(self) -> None:
        if self.read_paused:
            self._resumed()
        super().resume_reading()


class HandedOver(HttpToolsProtocol):
    """HttpToolsProtocol with a stall limit on the request's bytes and half-closes kept (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.receiving = False  # a request's bytes are arriving: from its first byte to its body's end
        self.progress = 0.0  # time.monotonic() of the last of them (or of the application's last read)
        self.stall: asyncio.TimerHandle | None = None
        self.half_close: HalfClose | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _Flow(transport, self._progressed)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_stall()
        if self.half_close is not None:
            self.half_close.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.progress = time.monotonic()
        super().data_received(data)

    def on_message_begin(self) -> None:  # at a request's first byte
        super().on_message_begin()
        self.receiving = True
        self._arm_stall()

    def on_headers_complete(self) -> None:
        # uvicorn keeps only the path of an absolute-form target (`GET http://other.example/version`): the
        # security layer must still see that the request named a host of its own (issue 36 item 8)
        if not self.url.startswith(b"/") and self.url != b"*":
            cast(dict[str, Any], self.scope)[ABSOLUTE_FORM] = True  # an extension key of ours
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.receiving = False
        self._stop_stall()

    def eof_received(self) -> bool | None:  # type: ignore[override]  # True keeps the transport open
        cycle = self.cycle
        if self.receiving or cycle is None or cycle.response_complete:
            return None  # idle, or half a request that cannot be completed now: close
        self.half_close = watch_half_close(self.loop, self.client, self.server, self.transport.close)
        if self.half_close is None:
            return None  # see the module's doc: the client left
        cycle.keep_alive = False  # nothing more can come: close once answered
        return True

    # the stall limit

    def _progressed(self) -> None:
        self.progress = time.monotonic()

    def _arm_stall(self) -> None:
        self._stop_stall()
        self.stall = self.loop.call_later(REQUEST_STALL_SECONDS, self._check_stall)

    def _stop_stall(self) -> None:
        if self.stall is not None:
            self.stall.cancel()
            self.stall = None

    def _check_stall(self) -> None:
        self.stall = None
        if not self.receiving or self.transport.is_closing():
            return
        now = time.monotonic()
        cycle = self.cycle
        waiting = self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue)
        if waiting:  # the application does not read (or asked for nothing yet): not the client's delay
            self.progress = now
        elif now - self.progress >= REQUEST_STALL_SECONDS:
            self._answer_stalled()
            return
        self.stall = self.loop.call_later(self.progress + REQUEST_STALL_SECONDS - now, self._check_stall)

    def _answer_stalled(self) -> None:
        """408, unless the application began its answer already; then the connection closes."""
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            body = stalled_answer()
            headers = [*self.server_state.default_headers, (b"content-type", b"application/json")]
            headers += [(b"content-length", b"%d" % len(body)), (b"connection", b"close")]
            head = b"HTTP/1.1 408 Request Timeout\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
            self.transport.write(head + b"\r\n" + body)
        if cycle is not None:
            cycle.disconnected = True  # the application is told the client left; its answer goes nowhere
            cycle.message_event.set()
        self.transport.close()
