"""Keep-alive for a stream that waits: queued behind another request, its model loading, a long prefill.

Agents' clients and the gateways between them drop a connection that stays silent too long (OpenCode:
300 s). Anthropic's streams carry `event: ping`; an SSE comment line is what every SSE client skips
(OpenAI's SDKs, and the Responses stream's). Ollama's NDJSON has no line its clients skip (the `ollama`
Python client parses every line, an empty one included, as JSON), so its ping is a piece of the answer
with no text (server/ollama_serving.py), as Ollama's own streams carry where a token holds no text. The
HTTP front (server/front.py) does the same for the OpenAI streams it relays: its head and comments, as
chunks, until the engine's first bytes, whose own head is then not passed on.

The status of a stream is the engine's as long as possible: the engine call is given `interval()` seconds
to start (a refusal within them, a prompt over the context included, is still an HTTP error); after that
the stream's head goes out, pings follow every interval until the engine answers, and a refusal that
comes later is the stream's error event. Once the engine streams, a ping goes between events whenever it
has been silent for an interval (a prefill behind a head sent early). Where the pings change hands (the
engine's head ends an early head's pings, which the engine's stream's own then follow) a ping goes at
once: no silence is longer than an interval, a seam included.

What a head sent early says: `X-Modelrunner-Constraint` is known before a runner is acquired (which engine
serves the model, so whether it gets the grammar, follows from the model and the backend asked for), so it
is put in the answer's head then (`announce_constraint`). `X-Modelrunner-Tool-Rescue` says that calls were
rescued, which only a whole answer knows before its head (a stream's head goes before its calls, early or
not): streams do not carry it (`/metrics` counts them), and only streams get an early head. The front's
early head frames the stream as chunks, whatever framing the engine's answer has (server/engine_pool.py
frames a sized or close-delimited one anew).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

from modelrunner.compat import structured
from modelrunner.config import env_seconds
from modelrunner.errors import ModelRunnerError
from modelrunner.server import lifecycle
from modelrunner.server.proxy import EVENT_STREAM_HEADERS, Message, Send, stream_end_event
from modelrunner.wire import EVENT_END, ends_event, error_message, tail_after

T = TypeVar("T")

ENV = "MODEL_RUNNER_STREAM_KEEPALIVE"
DEFAULT_INTERVAL = 10.0
ANTHROPIC_PING = b'event: ping\ndata: {"type": "ping"}\n\n'
SSE_COMMENT = b": keep-alive\n\n"


def line_ended(tail: bytes) -> bool:
    """Where an Ollama stream may take a ping: after a whole NDJSON line."""
    return tail.endswith(b"\n")


def interval() -> float:
    """`MODEL_RUNNER_STREAM_KEEPALIVE`: seconds a stream may stay silent before a ping (0: never)."""
    return env_seconds(ENV, DEFAULT_INTERVAL)


def announce_constraint(
    inference: lifecycle.Inference, name: str, backend: str | None, schema: dict[str, Any] | None
) -> None:
    """`X-Modelrunner-Constraint` in the current answer's head from now on, before a runner is acquired: a
    stream that waits sends its head early (pings). A model or backend that cannot be resolved is left to
    the acquisition to refuse."""
    if schema is None:
        return
    try:
        engine = inference.engine_for(inference.store.get(name), backend)
    except ModelRunnerError:
        return
    lifecycle.current().announce(structured.Constraint(schema, enforced=engine.schema_grammar).header)


async def discard(task: asyncio.Task[Any], close: Callable[[Any], Coroutine[Any, Any, None]]) -> None:
    """Cancel a start nobody waits for any more; what it made all the same is closed (`close`)."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.wait({task})
    if not task.cancelled() and task.exception() is None:
        await close(task.result())


async def within(
    start: Coroutine[Any, Any, T], every: float, close: Callable[[T], Coroutine[Any, Any, None]]
) -> T | asyncio.Task[T]:
    """`start`'s result if it comes (or fails) within `every` seconds (at once when pings are off), else
    its task, still running, for `waiting`."""
    if not every:
        return await start
    task = asyncio.ensure_future(start)
    try:
        await asyncio.wait({task}, timeout=every)
    except BaseException:  # the request is cancelled: so is its start
        await discard(task, close)
        raise
    return task.result() if task.done() else task


async def waiting(
    task: asyncio.Task[T],
    answer: Callable[[T], AsyncIterator[bytes]],
    ping: bytes,
    every: float,
    failed: Callable[[ModelRunnerError], bytes],
    close: Callable[[T], Coroutine[Any, Any, None]],
    ended: Callable[[bytes], bool] = ends_event,
) -> AsyncIterator[bytes]:
    """A stream whose head goes out before its engine answered: pings while `task` runs, then `answer`'s
    bytes (pinged, the first ping at once: a seam); a start that fails ends the stream with `failed`'s
    event."""
    try:
        while not task.done():
            yield ping
            await asyncio.wait({task}, timeout=every)
        started = task.result()
    except ModelRunnerError as exc:
        yield failed(exc)
        return
    finally:
        if not task.done():  # the client left (or the daemon stops) while it waited
            await discard(task, close)
    yield ping
    async for chunk in pinged(answer(started), ping, every, ended):
        yield chunk


async def pinged(
    chunks: AsyncIterator[bytes], ping: bytes, every: float, ended: Callable[[bytes], bool] = ends_event
) -> AsyncIterator[bytes]:
    """`chunks` as they come, with `ping` between events (where `ended` says the last bytes end one: an
    SSE event by default, `line_ended` for NDJSON) whenever none came for `every` seconds."""
    if not every:
        async for chunk in chunks:
            yield chunk
        return
    tail = EVENT_END  # the last bytes passed on: a ping goes only where an event ended
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(chunks))
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                if ended(tail):
                    yield ping
                continue
            next_chunk, pending = pending, None
            try:
                chunk = next_chunk.result()
            except StopAsyncIteration:
                return
            yield chunk
            tail = tail_after(tail, chunk)
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait({pending})
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


# -- the HTTP front's streams (server/front.py): its head goes out before the engine's, framed as chunks --

EARLY_HEAD = [
    (b"content-type", b"text/event-stream"),
    (b"transfer-encoding", b"chunked"),
    *EVENT_STREAM_HEADERS,
]
LAST_CHUNK = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def error_event(body: bytes) -> bytes:
    """A refusal, as the event that ends an OpenAI stream whose head went out early: an OpenAI error body as
    it is, anything else as the error of a cut stream."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        return b"data: " + json.dumps(doc).encode() + EVENT_END
    return stream_end_event(EVENT_END, error_message(body) or "the engine failed")


class EarlyHead:
    """The ASGI relay's `send` (server/inference.py), with the front's keep-alive: a stream whose answer has
    not begun after an interval gets a 200 event-stream head and a comment every interval; then the
    handler's head is not passed on, its stream's body is, and a whole answer (a refusal) becomes the
    stream's error event."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.lock = asyncio.Lock()  # the handler's messages and the pings, one at a time
        self.answered = False  # the handler sent its head
        self.early = False  # ours went out first
        self.status = 0
        self.held = bytearray()
        self.pinger: asyncio.Task[None] | None = None

    def start(self, every: float, streamed: Callable[[], bool]) -> None:
        if every:
            self.pinger = asyncio.ensure_future(self._ping(every, streamed))

    async def stop(self) -> None:
        if self.pinger is not None:
            self.pinger.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait({self.pinger})

    async def __call__(self, message: Message) -> None:
        async with self.lock:
            if message["type"] == "http.response.start":
                self.answered = True
                self.status = message["status"]
                if self.early:
                    if self.status == 200:  # a seam: the stream's own pings follow from here
                        comment = {"type": "http.response.body", "body": SSE_COMMENT, "more_body": True}
                        await self.send(comment)
                    return
            if not self.early or self.status == 200:
                await self.send(message)
                return
            self.held += message.get("body", b"")
            if not message.get("more_body", False):
                event = error_event(bytes(self.held))
                await self.send({"type": "http.response.body", "body": event, "more_body": False})

    async def _ping(self, every: float, streamed: Callable[[], bool]) -> None:
        while True:
            await asyncio.sleep(every)
            async with self.lock:
                if self.answered:
                    return
                if not self.early:
                    if not streamed():
                        return
                    head = [(name, value) for name, value in EARLY_HEAD if name != b"transfer-encoding"]
                    await self.send({"type": "http.response.start", "status": 200, "headers": head})
                    self.early = True
                await self.send({"type": "http.response.body", "body": SSE_COMMENT, "more_body": True})
