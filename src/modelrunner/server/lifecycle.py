"""One lifecycle for every request, whichever API it came to and whichever path served it.

An `Exchange` follows one HTTP request from its head to its last byte: its id (the `X-Request-Id` header
and the `rid` of every log line written while it is served), the runners it holds, its open connections to
engines, the client's presence, and what was answered. Whatever serves the request (the HTTP front's byte
relay, the raw ASGI relay, the Ollama, Anthropic and Responses routers), the rules are the same:

* runners are acquired through `Inference.acquire`, which records them on the exchange, and released by
  the exchange (at once when the answer is complete, in any case when the exchange finishes);
* a client that leaves closes every engine connection of its exchange (the engine stops generating at its
  next token) and cancels a wait for a runner;
* at shutdown, requests still running after the grace period are ended by the daemon: their engine
  connections close and each relay ends its stream with an error in its API's shape;
* one access line per request when it finishes; the same, as a frozen record (server/access.py), goes
  to the request recorder and the daemon's request metrics (server/request_metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from modelrunner import eventlog
from modelrunner.compat import tool_rescue
from modelrunner.engines.base import Engine, Mode, ModelForEngine
from modelrunner.errors import ModelRunnerError
from modelrunner.scheduler.runner import Runner
from modelrunner.scheduler.scheduler import Busy, Scheduler
from modelrunner.server import capabilities
from modelrunner.server.access import Access, RequestHead
from modelrunner.server.proxy import App, Message, Receive, Scope, Send
from modelrunner.server.recorder import Record, Recorder
from modelrunner.server.request_metrics import RequestMetrics
from modelrunner.server.routes import api_family
from modelrunner.store.store import ModelStore, StoredModel

if TYPE_CHECKING:
    from modelrunner.engines.registry import EngineRegistry

access_log = logging.getLogger("modelrunner.access")
log = logging.getLogger(__name__)

_INCOMING_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")
_current: ContextVar[Exchange | None] = ContextVar("exchange", default=None)


class ClientGone(ModelRunnerError):
    """The client left before its answer was complete (nginx's 499: nobody reads this answer)."""

    status_code = 499


def model_for_engine(store: ModelStore, model: StoredModel, requested_as: str) -> ModelForEngine:
    from modelrunner.signing.record import check_before_load

    check_before_load(store, model)  # the trust policy: what runs is what was verified
    return ModelForEngine(
        id=model.id,
        reference=requested_as,
        bundle=store.bundle_of(model),
        format=model.config.format,
        context_size=model.config.context_size,
        size_bytes=sum(layer.size for layer in model.manifest.layers),
    )


def current_or_none() -> Exchange | None:
    return _current.get()


def current() -> Exchange:
    """The exchange of the request being served (set by the ASGI middleware or the front)."""
    exchange = _current.get()
    if exchange is None:
        raise RuntimeError("no request lifecycle: inference must run inside an exchange")
    return exchange


class Exchange:
    """One request: what it holds, whether its client is still there, what it was answered."""

    def __init__(self, lifecycle: Lifecycle, method: str, path: str, headers: Mapping[bytes, bytes]) -> None:
        self.lifecycle = lifecycle
        incoming = headers.get(eventlog.REQUEST_ID_HEADER, b"")
        self.head = RequestHead(
            method=method,
            path=path,
            api=api_family(path),
            request_id=incoming.decode() if _INCOMING_ID.fullmatch(incoming) else eventlog.new_request_id(),
            user_agent=headers.get(b"user-agent", b"").decode("latin-1")[:200],
            started=time.monotonic(),
        )
        self.first_byte: float | None = None
        self.status = 0
        self.bytes_out = 0
        self.complete = False  # the whole answer was handed to the server
        self.model: str | None = None
        self.request_body = b""  # its start, for the recorder (server/recorder.py bounds it)
        self.request_size = 0
        self.record: Record | None = None
        self.head_headers: Sequence[tuple[bytes, bytes]] = ()  # the headers of the answer's head, once sent
        self.client_gone = False
        self.aborted: str | None = None  # why the daemon ended it (shutdown)
        self.receive: Receive | None = None  # the ASGI receive, to notice a client that leaves
        self.runners: list[Runner] = []
        self.answer_headers: list[tuple[bytes, bytes]] = []  # what the answer's head says about it
        self._closers: dict[int, Callable[[], None]] = {}
        self._next_closer = 0
        self._waiting: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def method(self) -> str:
        return self.head.method

    @property
    def path(self) -> str:
        return self.head.path

    @property
    def api(self) -> str:
        return self.head.api

    @property
    def id(self) -> str:
        return self.head.request_id

    @property
    def started(self) -> float:
        return self.head.started

    def keep_request(self, chunk: bytes) -> None:
        """The request body as it arrives, kept up to the recorder's limit."""
        self.request_size += len(chunk)
        recorder = self.lifecycle.recorder
        room = (recorder.request_limit if recorder is not None else 0) - len(self.request_body)
        if room > 0:
            self.request_body += chunk[:room]

    def kept_request(self) -> bytes:
        """The request body as the recorder keeps it: its start, and what was left out."""
        request = self.request_body
        if self.request_size > len(request):
            request += f"...[truncated {self.request_size - len(request)} bytes]".encode()
        return request

    # -- runners ---------------------------------------------------------------------------------------

    def hold(self, runner: Runner) -> None:
        self.runners.append(runner)

    async def release(self, runner: Runner) -> None:
        """Give the runner back to the scheduler (once: later calls do nothing)."""
        if runner in self.runners:
            self.runners.remove(runner)
            await self.lifecycle.release(runner)

    @contextlib.asynccontextmanager
    async def waiting(self) -> AsyncIterator[None]:
        """A wait for a runner: a client that leaves (or a shutdown) cancels it."""
        self._stop_if_over()
        task = asyncio.current_task()
        self._waiting = task
        try:
            yield
        except asyncio.CancelledError:
            if task is None or not (self.client_gone or self.aborted) or task.cancelling() > 1:
                raise
            task.uncancel()  # our cancellation, not the server's: answered as an error
            self._stop_if_over()
            raise
        finally:
            self._waiting = None

    # -- engine connections ----------------------------------------------------------------------------

    def opened(self, close: Callable[[], None]) -> Callable[[], None]:
        """Register an engine connection, closed if the client leaves; returns what unregisters it."""
        self._stop_if_over()
        key = self._next_closer
        self._next_closer += 1
        self._closers[key] = close
        self.watch()

        def forget() -> None:
            self._closers.pop(key, None)

        return forget

    def _stop_if_over(self) -> None:
        if self.aborted:
            raise Busy(self.aborted)
        if self.client_gone:
            raise ClientGone("the client closed the connection")

    def _close_upstreams(self) -> None:
        closers, self._closers = list(self._closers.values()), {}
        for close in closers:
            close()

    def client_left(self) -> None:
        if self.complete or self.client_gone:
            return
        self.client_gone = True
        self._interrupt()

    def abort(self, reason: str) -> None:
        """End the request from our side (shutdown): engine connections close, a wait is cancelled."""
        if self.aborted is None:
            self.aborted = reason
            self._interrupt()

    def _interrupt(self) -> None:
        self._close_upstreams()
        if self._waiting is not None:
            self._waiting.cancel()

    def failure(self, detail: object) -> str:
        """What to tell a client whose answer was cut: our reason, or what the engine did."""
        return self.aborted or f"the engine stopped while answering: {detail}"

    def cut(self, detail: object) -> ModelRunnerError:
        """The error of an engine call cut short: a client that left closed it (a 499, as the OpenAI
        relays count it, not an engine failure), else `failure`'s 500."""
        if self.client_gone and not self.aborted:
            return ClientGone("the client closed the connection")
        return ModelRunnerError(self.failure(detail))

    def watch(self) -> None:
        """On the ASGI path, notice a client that leaves while the answer is prepared (the front's
        protocol is told by its transport instead)."""
        if self._watcher is None and self.receive is not None:
            self._watcher = self.lifecycle.spawn(self._watch(self.receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.complete:
                    self.client_left()
                return

    # -- the answer ------------------------------------------------------------------------------------

    def announce(self, header: tuple[bytes, bytes]) -> None:
        """A header the answer's head says about it (once), if the head has not gone out yet."""
        if header not in self.answer_headers:
            self.answer_headers.append(header)

    def tool_calls_rescued(self, count: int) -> None:
        """The answer carries `count` tool calls the engine wrote as text (compat/tool_rescue.py)."""
        self.announce((tool_rescue.HEADER, b"1"))
        self.lifecycle.metrics.rescued(self.api, self.model, count)

    def started_answer(self, status: int, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.status = status
        self.first_byte = time.monotonic()
        self.head_headers = headers
        if self.record is not None:
            self.record.answer_head(status, headers)

    def recorded(self, record: Record) -> None:
        """The request's record, from its runner's acquisition on. A head that went out before (keep-alive
        comments while the model loaded) is the record's too: its type says the answer is a stream."""
        self.record = record
        if self.status:
            record.answer_head(self.status, self.head_headers)

    def answered(self, data: bytes, last: bool) -> None:
        self.bytes_out += len(data)
        if self.record is not None and data:
            self.record.tee(data)
        if last:
            self.complete = True

    @property
    def busy(self) -> bool:
        """Holding or waiting for a runner, or talking to an engine."""
        return bool(self.runners or self._closers or self._waiting)

    def outcome(self) -> str:
        if self.aborted:
            return "aborted"
        if self.client_gone:
            return "client_left"
        return "complete" if self.complete else "incomplete"

    def access(self) -> Access:
        """The request as its access line says it, now."""
        ended = time.monotonic()
        ttfb = None if self.first_byte is None else round((self.first_byte - self.started) * 1000, 1)
        return Access(
            head=self.head,
            model=self.model,
            status=self.status or (499 if self.client_gone else 0),
            bytes_out=self.bytes_out,
            ttfb_ms=ttfb,
            duration_ms=round((ended - self.started) * 1000, 1),
            outcome=self.outcome(),
        )

    async def finish(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        self._close_upstreams()
        for runner in list(self.runners):
            await self.release(runner)


class Lifecycle:
    """The exchanges of one daemon: begun and finished here, owned background tasks, the shutdown."""

    def __init__(self, scheduler: Scheduler, recorder: Recorder | None = None) -> None:
        self.scheduler = scheduler
        self.recorder = recorder
        self.metrics = RequestMetrics()
        self.open: set[Exchange] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    def begin(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> Exchange:
        exchange = Exchange(self, method, path, {bytes(k).lower(): bytes(v) for k, v in headers})
        self.open.add(exchange)
        eventlog.request_id.set(exchange.id)
        _current.set(exchange)
        return exchange

    async def finish(self, exchange: Exchange) -> None:
        """Everything the exchange holds goes back, even when its task is being cancelled."""
        try:
            if exchange.busy or exchange._watcher is not None:
                await asyncio.shield(self.spawn(exchange.finish()))
        finally:
            self.open.discard(exchange)
            access = exchange.access()
            if self.recorder is not None and exchange.record is not None:
                self.recorder.finish(exchange.record, access)
            self.metrics.observe(access, exchange.record)
            # level and soon spelled out: mypy cannot tell that the fields name neither
            eventlog.event(access_log, "request", logging.INFO, soon=False, **access.fields())

    async def release(self, runner: Runner) -> None:
        if not self.scheduler.release_nowait(runner):
            # in a task of its own, which a cancellation of the request cannot stop
            await asyncio.shield(self.spawn(self.scheduler.release(runner)))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A task the daemon keeps a reference to until it ends (asyncio itself keeps only weak ones)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, grace: float, reason: str = "the model runner is shutting down") -> None:
        """Shutdown: let inference requests finish for `grace` seconds, then end those still running (their
        relays close each stream with an error event and its proper end), and wait for them to do so.
        Other requests are uvicorn's to wait for."""
        if self.recorder is not None:
            self.recorder.close()  # followers of /engines/requests would never end by themselves
        deadline = time.monotonic() + grace
        while any(e.busy for e in self.open) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        running = [e for e in self.open if e.busy]
        if not running:
            return
        eventlog.event(log, "shutdown_ends_requests", logging.WARNING, requests=len(running), grace_s=grace)
        for exchange in running:
            exchange.abort(reason)
        deadline = time.monotonic() + 2.0
        while any(e.busy for e in self.open) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


class Inference:
    """Where every API gets and gives back runners: the model from the store, its engine, the scheduler,
    all on the current exchange."""

    def __init__(
        self, store: ModelStore, scheduler: Scheduler, engines: EngineRegistry, lifecycle: Lifecycle
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.engines = engines
        self.lifecycle = lifecycle

    def engine_for(self, model: StoredModel, backend: str | None = None) -> Engine:
        return self.engines.resolve(backend, model.config)

    async def acquire(
        self,
        name: str,
        mode: Mode = Mode.COMPLETION,
        keep_alive: float | None = None,
        backend: str | None = None,
        record: bool = True,
        needs: capabilities.Needs = capabilities.NOTHING,
    ) -> Runner:
        """A ready runner for the model called `name`, held by the current exchange until it finishes
        (or `release`); the exchange is recorded unless `record` is false (loads without inference).
        A request that `needs` what the model cannot do is refused first (server/capabilities.py)."""
        exchange = current()
        model = self.store.get(name)
        try:
            engine = self.engine_for(model, backend)
            if needs:
                engine.check_request(name, model.config, self.store.bundle_of(model), needs)
            exchange.model = exchange.model or name
            runner = self.scheduler.reuse(engine.name, model.id, mode, keep_alive)
            if runner is None and not self.scheduler.has_runner(engine.name, model.id, mode):
                engine.require_installed()
        except ModelRunnerError:
            # refused before any engine saw it: recorded all the same, so `model requests` says why
            recorder = self.lifecycle.recorder
            if record and recorder is not None and exchange.record is None:
                exchange.recorded(recorder.start(exchange.head, exchange.kept_request(), name, model.id, {}))
            raise
        if runner is None:
            exchange.watch()
            async with exchange.waiting():
                runner = await self.scheduler.acquire(
                    engine, model_for_engine(self.store, model, name), mode, keep_alive
                )
        exchange.hold(runner)
        recorder = self.lifecycle.recorder
        if record and recorder is not None and exchange.record is None:
            config = recorder.runner_config(
                runner, lambda: self.scheduler.settings.get(engine.name, model.id, mode)
            )
            exchange.recorded(recorder.start(exchange.head, exchange.kept_request(), name, model.id, config))
        return runner

    async def release(self, runner: Runner) -> None:
        await current().release(runner)


class LifecycleMiddleware:
    """The outermost ASGI layer: an exchange per request (id, access line, recorder), the
    `X-Request-Id` header on every answer, and HEAD served wherever GET is (liveness probes use it)."""

    def __init__(self, app: App, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = self.lifecycle.begin(scope["method"], scope["path"], scope["headers"])
        exchange.receive = receive
        request_id = exchange.id.encode()

        async def tracked_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    *message.get("headers", []),
                    *exchange.answer_headers,
                    (eventlog.REQUEST_ID_HEADER, request_id),
                ]
                message = {**message, "headers": headers}
                exchange.started_answer(message["status"], headers)
            elif message["type"] == "http.response.body":
                exchange.answered(message.get("body", b""), not message.get("more_body", False))
            await send(message)

        try:
            if scope["method"] == "HEAD":
                await self._head(scope, receive, tracked_send)
            else:
                await self.app(scope, receive, tracked_send)
        finally:
            await self.lifecycle.finish(exchange)

    async def _head(self, scope: Scope, receive: Receive, send: Send) -> None:
        """HEAD where a route takes it, else as GET: the server sends the head of the GET answer only."""
        refused = False

        async def unless_refused(message: Message) -> None:
            nonlocal refused
            if message["type"] == "http.response.start" and message["status"] == 405:
                refused = True
            if not refused:
                await send(message)

        await self.app(scope, receive, unless_refused)
        if refused:
            await self.app({**scope, "method": "GET"}, receive, send)
