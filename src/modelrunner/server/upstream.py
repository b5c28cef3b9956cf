"""Calls to an engine's HTTP API over its runner's Unix socket, inside the request's exchange: bytes out,
the answer's head and its body's bytes in, nothing more. Every call registers its connection with the
exchange, so a client that leaves closes it, and `close()` gives the runner back. What a call sends is
prepared in server/engine_request.py, and what its answer becomes (assembled, rescued, checked, reworded)
is server/served_call.py's, for every API family.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from modelrunner.config import env_seconds
from modelrunner.errors import ModelRunnerError
from modelrunner.eventlog import event
from modelrunner.http1 import Answer, UpstreamError
from modelrunner.response_reader import MAX_HEAD
from modelrunner.scheduler.rundir import untrusted_socket
from modelrunner.scheduler.runner import Runner
from modelrunner.server.lifecycle import Exchange
from modelrunner.server.proxy import request_bytes, retry_full_backlog
from modelrunner.wire import error_message

log = logging.getLogger(__name__)

MAX_ERROR_BODY = 1024 * 1024
MAX_JSON_BODY = 64 * 1024 * 1024  # embeddings of many inputs are large
READ_ERRORS = (UpstreamError, ConnectionError, asyncio.IncompleteReadError, ValueError)
DEFAULT_ENGINE_IDLE = 600.0


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


class EngineCall:
    """One request to a runner. `close()` it: that closes the connection and releases the runner."""

    def __init__(self, exchange: Exchange, runner: Runner, load_seconds: float = 0.0) -> None:
        self.exchange = exchange
        self.runner = runner
        self.load_seconds = load_seconds
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.idle = engine_idle_timeout() or None
        self._answer: Answer | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._forget: Any = None

    async def send(self, path: str, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Send the request and read the answer's head."""
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

    async def beside(self, path: str, body: bytes) -> bytes | None:
        """A short request to the same runner on a connection of its own, while this call holds the runner
        (a count of tokens, answered by llama-server's HTTP thread, not a slot): its answer's body, None
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
            writer.write(request_bytes("POST", path, [], body))
            await writer.drain()
            if (await answer.read_head()).status != 200:
                return None
            data = bytearray()
            async for chunk in answer.chunks(self.idle):
                data += chunk
                if len(data) > MAX_ERROR_BODY:
                    return None
            return bytes(data)
        except (OSError, *READ_ERRORS):
            return None
        finally:
            if forget is not None:
                forget()
            writer.close()

    @property
    def event_stream(self) -> bool:
        head = self._answer.reader.head if self._answer is not None else None
        return head is not None and head.event_stream

    def chunks(self) -> AsyncIterator[bytes]:
        assert self._answer is not None
        return self._answer.chunks(self.idle)

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

    async def close(self) -> None:
        if self._writer is not None:
            if self._forget is not None:
                self._forget()
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
            self._writer = None
        await self.exchange.release(self.runner)
