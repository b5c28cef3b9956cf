"""Calls to an engine's HTTP API over its runner's Unix socket, inside the request's exchange.

The translated APIs (Ollama, Anthropic, Responses) read what the engine answers, as parsed JSON or as
server-sent events; the OpenAI routes read whole answers when they must change them (an assembled
non-streamed answer, an embedding error). Every call registers its connection with the exchange, so a
client that leaves closes it, and `close()` gives the runner back. What a call sends is prepared in
server/engine_request.py, for every API family.

A non-streamed generation on llama.cpp is asked for as a stream and assembled (compat/assemble.py says
why; `Engine.assembles_unstreamed`): the only way llama-server stops generating for a client that left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from modelrunner.compat import assemble, structured, tool_rescue
from modelrunner.compat.context_overflow import refusal
from modelrunner.compat.embeddings import Shortening
from modelrunner.config import env_seconds
from modelrunner.engines.base import Mode
from modelrunner.errors import BadRequest, ModelRunnerError
from modelrunner.eventlog import event
from modelrunner.http1 import Answer, UpstreamError
from modelrunner.response_reader import MAX_HEAD
from modelrunner.scheduler.rundir import untrusted_socket
from modelrunner.scheduler.runner import Runner
from modelrunner.server.errors import OPENAI, error_body, exception_payload
from modelrunner.server.lifecycle import Exchange
from modelrunner.server.proxy import request_bytes, retry_full_backlog
from modelrunner.wire import SSEDecoder, error_message

log = logging.getLogger(__name__)

MAX_ERROR_BODY = 1024 * 1024
MAX_JSON_BODY = 64 * 1024 * 1024  # embeddings of many inputs are large
# Two searches, not one pattern with `.*` between: that backtracks over a hostile error body (1 MiB: ~10 s)
_TOO_LARGE = re.compile(r"input \((\d{1,12}) tokens\) is too large to process")
_BATCH_SIZE = re.compile(r"current batch size: (\d{1,12})")
READ_ERRORS = (UpstreamError, ConnectionError, asyncio.IncompleteReadError, ValueError)
DEFAULT_ENGINE_IDLE = 600.0
RESCUE_INLINE_BYTES = 16 * 1024  # a longer answer's calls are read in a thread (`EngineCall._rescue`)


def engine_idle_timeout() -> float:
    """`MODEL_RUNNER_ENGINE_IDLE_TIMEOUT`: seconds an engine may send nothing in the middle of an answer's
    body (a stream's prefill included: engines send a stream's head first) before the request ends with
    the engine's error and its runner is released; 0: no limit; 600 by default. The wait for the head is
    not limited: an engine that answers a request unstreamed sends its head only when its answer is done."""
    return env_seconds("MODEL_RUNNER_ENGINE_IDLE_TIMEOUT", DEFAULT_ENGINE_IDLE)


class EngineUnreachable(ModelRunnerError):
    status_code = 502


class EngineFailed(ModelRunnerError):
    """The engine answered with an error status: `status_code` and `message` are its own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status


def engine_error_message(status: int, body: bytes) -> str:
    """The message of an engine's error body, whatever its shape (OpenAI, llama-server, plain text)."""
    return error_message(body) or f"the engine answered with status {status}"


class InputTooLong(EngineFailed):
    """llama-server refuses an embedding input longer than its physical batch (sized to the context,
    engines/llamacpp.py) with a 500; it is the client's input that is too long: a 400 saying so, with
    the limit in tokens for those that truncate (Ollama's `truncate`)."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(
            400,
            f"the input ({tokens} tokens) is longer than the model's context ({limit} tokens): "
            "shorten it, or configure a larger context size",
        )
        self.limit = limit


def input_too_long(status: int, message: str) -> InputTooLong | None:
    found = _TOO_LARGE.search(message) if status == 500 else None
    batch = _BATCH_SIZE.search(message, found.end()) if found is not None else None
    return None if found is None or batch is None else InputTooLong(int(found.group(1)), int(batch.group(1)))


class EngineCall:
    """One request to a runner. `close()` it: that closes the connection and releases the runner."""

    def __init__(self, exchange: Exchange, runner: Runner, load_seconds: float = 0.0) -> None:
        self.exchange = exchange
        self.runner = runner
        self.load_seconds = load_seconds
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.assembling: str | None = None  # the path whose unstreamed answer is assembled
        self.shortening: Shortening | None = None  # what an embeddings request asked of the vectors
        self.constraint: structured.Constraint | None = None  # the JSON its answer must be (`constrain`)
        self.tools: tool_rescue.Tools | None = None  # declared: calls written as text are rescued
        self.unopened = False  # an assembled message whose stream lacked `message_start`: no input count
        self.path = ""
        self.idle = engine_idle_timeout() or None
        self._answer: Answer | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._forget: Any = None

    async def send(self, path: str, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Send the request and read the answer's head."""
        self.path = path
        socket = str(self.runner.socket)
        try:
            untrusted = untrusted_socket(self.runner.socket)
            if untrusted is not None:  # another user's socket would see (and answer) the prompt
                event(log, "engine_socket_refused", logging.ERROR, reason=untrusted)
                raise EngineUnreachable(f"the engine is not reachable: {untrusted}")
            reader, writer = await retry_full_backlog(
                lambda: asyncio.open_unix_connection(socket, limit=MAX_HEAD)
            )
        except OSError as exc:
            raise EngineUnreachable(f"the engine is not reachable: {exc.strerror or exc}") from None
        self._answer, self._writer = Answer(reader), writer
        self._forget = self.exchange.opened(writer.close)
        try:
            writer.write(request_bytes("POST", path, headers or [], body))
            await writer.drain()
            head = await self._answer.read_head()
            self.status, self.headers = head.status, head.headers
        except (OSError, UpstreamError) as exc:
            raise self.exchange.cut(exc) from None

    async def beside(self, path: str, doc: dict[str, Any]) -> dict[str, Any] | None:
        """A short JSON request to the same runner on a connection of its own, while this call holds the
        runner (a count of tokens, answered by llama-server's HTTP thread, not a slot): its answer, None
        when it fails. It ends with the call's exchange, as the call does."""
        if untrusted_socket(self.runner.socket) is not None:
            return None
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.runner.socket), limit=MAX_HEAD)
        except OSError:
            return None
        forget: Any = None
        try:
            forget = self.exchange.opened(writer.close)  # raises when the client already left
            answer = Answer(reader)
            writer.write(request_bytes("POST", path, [], json.dumps(doc).encode()))
            await writer.drain()
            if (await answer.read_head()).status != 200:
                return None
            body = bytearray()
            async for chunk in answer.chunks(self.idle):
                body += chunk
                if len(body) > MAX_ERROR_BODY:
                    return None
            found = json.loads(body)
            return found if isinstance(found, dict) else None
        except (OSError, *READ_ERRORS):
            return None
        finally:
            if forget is not None:
                forget()
            writer.close()

    def constrain(self, constraint: structured.Constraint) -> None:
        """Check the answer against a requested schema, and say so in the answer's head."""
        self.constraint = constraint
        self.exchange.announce(constraint.header)

    @property
    def event_stream(self) -> bool:
        head = self._answer.reader.head if self._answer is not None else None
        return head is not None and head.event_stream

    def chunks(self) -> AsyncIterator[bytes]:
        assert self._answer is not None
        return self._answer.chunks(self.idle)

    async def relayed(self) -> AsyncIterator[bytes]:
        """The answer's bytes for a client that gets them as they come; a constrained stream ends with its
        `[DONE]` only once its text validates (else ConstraintFailed, for the caller to end it with)."""
        if self.constraint is None or self.status != 200 or not self.event_stream:
            async for chunk in self.chunks():
                yield chunk
            return
        check = structured.StreamCheck(self.constraint)
        async for chunk in self.chunks():
            out = check.feed(chunk)
            if out:
                yield out
        yield check.end()

    async def read(self, limit: int = MAX_JSON_BODY) -> bytes:
        data = bytearray()
        try:
            async for chunk in self.chunks():
                data += chunk
                if len(data) > limit:
                    raise ModelRunnerError("the engine's answer is too large")
        except READ_ERRORS as exc:
            raise self.exchange.cut(exc) from None
        return bytes(data)

    async def raise_for_status(self) -> None:
        if self.status >= 400:
            raise self.error(self.status, await self.read(MAX_ERROR_BODY))

    def error(self, status: int, body: bytes) -> ModelRunnerError:
        """The engine's refusal as the error to answer: a prompt over the context in the words clients
        act on (compat/context_overflow.py), an embedding input too long as a 400, else the engine's own."""
        overflow = refusal(status, body)
        if overflow is not None:
            return overflow
        message = engine_error_message(status, body)
        if self.runner.key.mode in (Mode.EMBEDDING, Mode.RERANKING):
            too_long = input_too_long(status, message)
            if too_long is not None:
                return too_long
        return EngineFailed(status, message)

    async def answer(self) -> tuple[int, bytes]:
        """The whole answer (status, JSON body) as the client gets it: assembled from the engine's stream
        when the call asked for one, an embedding input that is too long as a 400, embeddings shortened
        as the request asked."""
        if self.assembling is None or self.status != 200 or not self.event_stream:
            body = await self.read()
            if self.status >= 400:
                failed = self.error(self.status, body)
                if not isinstance(failed, EngineFailed) or failed.status_code != self.status:
                    answer = exception_payload(OPENAI, failed)
                    return failed.status_code, json.dumps(answer).encode()
            elif self.shortening is not None:
                return self._shortened(self.shortening, body)
            return self._checked(self.status, await self._rescued_body(body) if self.status == 200 else body)
        assembler = assemble.assembler_for(self.assembling, self.exchange.model or "")
        size = 0  # of the stream: the answer's text is shorter
        try:
            async for chunk in self.chunks():
                size += len(chunk)
                assembler.feed(chunk)
            doc = assembler.result()
            self.unopened = isinstance(assembler, assemble.MessageAssembler) and not assembler.started
        except READ_ERRORS as exc:
            raise self.exchange.cut(exc) from None
        except assemble.AssemblyError as exc:
            if exc.body is None:
                raise self.exchange.cut(exc) from None
            return exc.status, json.dumps(exc.body).encode()
        await self._rescue(doc, size)
        return self._checked(200, json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode())

    def _checked(self, status: int, body: bytes) -> tuple[int, bytes]:
        """A successful answer whose JSON is not what the request asked for becomes the error saying so."""
        if self.constraint is None or status != 200:
            return status, body
        try:
            doc = json.loads(body)
            if not self.constraint.check_answer(doc if isinstance(doc, dict) else {}):
                self._say_unvalidated()
        except (ValueError, UnicodeDecodeError):
            failed = structured.ConstraintFailed("the engine sent an answer that is not JSON")
            return failed.status_code, json.dumps(error_body(failed.status_code, failed.message)).encode()
        except structured.ConstraintFailed as exc:
            return exc.status_code, json.dumps(error_body(exc.status_code, exc.message)).encode()
        return status, body

    def _say_unvalidated(self) -> None:
        """The head of an answer cut by its token limit says that its JSON was not checked."""
        headers = self.exchange.answer_headers
        headers[:] = [header for header in headers if header[0] != structured.HEADER]
        self.exchange.announce(structured.UNVALIDATED)

    def _shortened(self, shortening: Shortening, body: bytes) -> tuple[int, bytes]:
        try:
            return self.status, shortening.answer_bytes(body)
        except BadRequest as exc:
            return exc.status_code, json.dumps(error_body(exc.status_code, exc.message, exc.param)).encode()

    async def _rescue(self, doc: dict[str, Any], size: int) -> bool:
        """Tool calls the engine wrote as text, made calls in the answer (compat/tool_rescue.py). An answer
        over RESCUE_INLINE_BYTES (`size`) is read in a thread: the reading is linear, yet a megabyte takes
        tens of milliseconds that the daemon's other requests need not wait."""
        if self.tools is None:
            return False
        rescue = tool_rescue.rescue_message if self.path == assemble.MESSAGES else tool_rescue.rescue_chat
        if size > RESCUE_INLINE_BYTES:
            count = await asyncio.to_thread(rescue, doc, self.tools)
        else:
            count = rescue(doc, self.tools)
        if count:
            self.exchange.tool_calls_rescued(count)
        return count > 0

    async def _rescued_body(self, body: bytes) -> bytes:
        """An unassembled answer, with its rescued calls."""
        if self.tools is None:
            return body
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return body
        if not isinstance(doc, dict) or not await self._rescue(doc, len(body)):
            return body
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()

    async def json(self) -> dict[str, Any]:
        status, body = await self.answer()
        if status >= 400:
            raise self.error(status, body)
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ModelRunnerError("the engine sent an answer that is not JSON") from None
        if not isinstance(doc, dict):
            raise ModelRunnerError("the engine sent an unexpected answer")
        return doc

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The `data:` payloads of a server-sent event stream, parsed; ends at `[DONE]` or the stream's end.

        A dying engine (or a daemon that ends the request) becomes a ModelRunnerError, for the caller to
        report in its API's shape.
        """
        decoder = SSEDecoder()
        text = structured.StreamText(self.constraint) if self.constraint is not None else None
        rescue = None  # calls written as text, made calls (compat/tool_rescue.py)
        if self.tools is not None and self.path == assemble.CHAT:
            rescue = tool_rescue.ChatStreamRescue(self.tools)

        def passed(docs: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            for out in docs:  # what the client gets is what the schema is checked against
                if text is not None:
                    text.add(out)
                yield out

        try:
            async for chunk in self.chunks():
                for _, payload in decoder.feed(chunk):
                    if payload == b"[DONE]":
                        for out in passed(rescue.end() if rescue is not None else []):
                            yield out
                        if text is not None:
                            text.check()
                        return
                    try:
                        doc = json.loads(payload)
                    except (ValueError, UnicodeDecodeError):
                        continue
                    if isinstance(doc, dict):
                        if "error" in doc and "choices" not in doc:
                            raise ModelRunnerError(engine_error_message(500, payload))
                        for out in passed(rescue.feed(doc) if rescue is not None else [doc]):
                            yield out
                        if rescue is not None and rescue.rescued:
                            self.exchange.tool_calls_rescued(rescue.rescued)
                            rescue.rescued = 0
            for out in passed(rescue.end() if rescue is not None else []):
                yield out
        except READ_ERRORS as exc:
            raise self.exchange.cut(exc) from None
        if text is not None:
            text.check()

    async def close(self) -> None:
        if self._writer is not None:
            if self._forget is not None:
                self._forget()
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
            self._writer = None
        await self.exchange.release(self.runner)
