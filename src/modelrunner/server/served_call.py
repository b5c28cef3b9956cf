"""An engine call as the serving layer reads it: the bytes of the call (server/upstream.py, a transport and
nothing more) through the steps its request was prepared with (server/engine_request.py). Each agent
feature is one step here, the same for every API family that reads a call:

* the refusal: a prompt over the context in the words clients act on (compat/context_overflow.py), an
  embedding input too long as a 400 (`InputTooLong`), else the engine's own error;
* the assembly of a non-streamed generation the engine was asked to stream (compat/assemble.py);
* the shortening of embeddings (compat/embeddings.py);
* the rescue of tool calls written as text (compat/tool_rescue.py), whole or streamed;
* the constraint: the JSON the answer must be (compat/structured.py), whole or streamed.

The billing block and thinking signatures are steps of the request (server/engine_request.py) and of the
Messages serving (server/anthropic_serving.py).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from modelrunner.compat import assemble, structured, tool_rescue
from modelrunner.compat.context_overflow import refusal
from modelrunner.compat.embeddings import Shortening
from modelrunner.engines.base import Mode
from modelrunner.errors import BadRequest, ModelRunnerError
from modelrunner.server.errors import OPENAI, error_body, exception_payload
from modelrunner.server.lifecycle import Exchange
from modelrunner.server.upstream import (
    MAX_ERROR_BODY,
    READ_ERRORS,
    EngineCall,
    EngineFailed,
    engine_error_message,
)
from modelrunner.wire import SSEDecoder, event_document

# Two searches, not one pattern with `.*` between: that backtracks over a hostile error body (1 MiB: ~10 s)
_TOO_LARGE = re.compile(r"input \((\d{1,12}) tokens\) is too large to process")
_BATCH_SIZE = re.compile(r"current batch size: (\d{1,12})")
RESCUE_INLINE_BYTES = 16 * 1024  # a longer answer's calls are read in a thread (`ServedCall._rescue`)


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


class ServedCall:
    """One request to a runner (`engine`, its bytes) and the steps of its answer. `close()` it: that
    closes the connection and releases the runner."""

    def __init__(
        self,
        engine: EngineCall,
        path: str,
        assembling: str | None = None,
        shortening: Shortening | None = None,
        constraint: structured.Constraint | None = None,
        tools: tool_rescue.Tools | None = None,
    ) -> None:
        self.engine = engine
        self.exchange: Exchange = engine.exchange
        self.path = path  # the engine's
        self.assembling = assembling  # the path whose unstreamed answer is assembled
        self.shortening = shortening  # an embeddings request's `dimensions`
        self.constraint = constraint  # the JSON its answer must be
        self.tools = tools  # declared: calls written as text are rescued
        self.unopened = False  # an assembled message whose stream lacked `message_start`: no input count
        if self.constraint is not None:  # the answer's head says it is checked
            self.exchange.announce(self.constraint.header)

    async def send(self, path: str, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        await self.engine.send(path, body, headers)

    async def close(self) -> None:
        await self.engine.close()

    # the refusal

    async def raise_for_status(self) -> None:
        status = self.engine.status
        if status >= 400:
            raise self.refused(status, await self.engine.read(MAX_ERROR_BODY))

    def refused(self, status: int, body: bytes) -> ModelRunnerError:
        """The engine's refusal as the error to answer: a prompt over the context in the words clients
        act on (compat/context_overflow.py), an embedding input too long as a 400, else the engine's own."""
        overflow = refusal(status, body)
        if overflow is not None:
            return overflow
        message = engine_error_message(status, body)
        if self.engine.runner.key.mode in (Mode.EMBEDDING, Mode.RERANKING):
            too_long = input_too_long(status, message)
            if too_long is not None:
                return too_long
        return EngineFailed(status, message)

    # whole answers

    async def answer(self) -> tuple[int, bytes]:
        """The whole answer (status, JSON body) as the client gets it: refused in the client's words,
        assembled from the engine's stream when the call asked for one, embeddings shortened, calls
        rescued, checked against its schema."""
        engine = self.engine
        if self.assembling is None or engine.status != 200 or not engine.event_stream:
            body = await engine.read()
            if engine.status >= 400:
                failed = self.refused(engine.status, body)
                if not isinstance(failed, EngineFailed) or failed.status_code != engine.status:
                    answer = exception_payload(OPENAI, failed)
                    return failed.status_code, json.dumps(answer).encode()
            elif self.shortening is not None:
                return self._shortened(self.shortening, body)
            if engine.status == 200:
                body = await self._rescued_body(body)
            return self._checked(engine.status, body)
        assembler = assemble.assembler_for(self.assembling, self.exchange.model or "")
        size = 0  # of the stream: the answer's text is shorter
        try:
            async for chunk in engine.chunks():
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

    async def json(self) -> dict[str, Any]:
        status, body = await self.answer()
        if status >= 400:
            raise self.refused(status, body)
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ModelRunnerError("the engine sent an answer that is not JSON") from None
        if not isinstance(doc, dict):
            raise ModelRunnerError("the engine sent an unexpected answer")
        return doc

    def _shortened(self, shortening: Shortening, body: bytes) -> tuple[int, bytes]:
        try:
            return self.engine.status, shortening.answer_bytes(body)
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

    # streams

    async def relayed(self) -> AsyncIterator[bytes]:
        """The answer's bytes for a client that gets them as they come; a constrained stream ends with its
        `[DONE]` only once its text validates (else ConstraintFailed, for the caller to end it with)."""
        engine = self.engine
        if self.constraint is None or engine.status != 200 or not engine.event_stream:
            async for chunk in engine.chunks():
                yield chunk
            return
        check = structured.StreamCheck(self.constraint)
        async for chunk in engine.chunks():
            out = check.feed(chunk)
            if out:
                yield out
        yield check.end()

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The `data:` payloads of a server-sent event stream, parsed, its calls written as text rescued in
        a chat stream, its text checked against its schema; ends at `[DONE]` or the stream's end.

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
            async for chunk in self.engine.chunks():
                for _, payload in decoder.feed(chunk):
                    if payload == b"[DONE]":
                        for out in passed(rescue.end() if rescue is not None else []):
                            yield out
                        if text is not None:
                            text.check()
                        return
                    if (doc := event_document(payload)) is not None:
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
