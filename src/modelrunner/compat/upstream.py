"""Calls from the compatible APIs (Ollama, Anthropic, Responses) to an engine's OpenAI-style API.

Unlike the plain OpenAI relay (server/proxy.py), these routes must read what the engine answers to
translate it, so they get a runner from the scheduler, send one JSON request on its Unix socket and expose
the answer as parsed JSON or as server-sent events. The runner is held until the answer is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from modelrunner.engines.base import Engine, Mode
from modelrunner.errors import EngineNotInstalled, ModelNotFound, ModelRunnerError
from modelrunner.http1 import MAX_HEAD, UpstreamError, body_chunks, read_head
from modelrunner.scheduler.runner import Runner
from modelrunner.scheduler.scheduler import Scheduler
from modelrunner.server.inference import KNOWN_BACKENDS, model_for_engine, select_engine_name
from modelrunner.store.store import ModelStore, StoredModel

MAX_ERROR_BODY = 1024 * 1024
MAX_JSON_BODY = 64 * 1024 * 1024  # embeddings of many inputs are large


class EngineFailed(ModelRunnerError):
    """The engine answered with an error status: `status_code` and `message` are its own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status


def engine_error_message(status: int, body: bytes) -> str:
    """The message of an engine's error body, whatever its shape (OpenAI, llama-server, plain text)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict):
        error = doc.get("error", doc)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(doc.get("message"), str):
            return str(doc["message"])
    text = body.decode(errors="replace").strip()
    return text[:500] or f"the engine answered with status {status}"


@dataclass
class EngineContext:
    """What the compatible routers need to reach engines."""

    store: ModelStore
    scheduler: Scheduler
    engines: Mapping[str, Engine]

    def engine_for(self, model: StoredModel, backend: str | None = None) -> Engine:
        if backend is not None and backend not in KNOWN_BACKENDS:
            raise ModelNotFound(f"unknown backend {backend[:40]!r}; known: {', '.join(KNOWN_BACKENDS)}")
        name = select_engine_name(backend, model.config.format)
        engine = self.engines.get(name)
        if engine is None:
            raise EngineNotInstalled(f"the {name} engine is not available in this build of modelrunner")
        return engine

    async def acquire(
        self,
        name: str,
        mode: Mode = Mode.COMPLETION,
        keep_alive: float | None = None,
        backend: str | None = None,
    ) -> Runner:
        """A ready runner for the model called `name`; the caller must release it."""
        model = self.store.get(name)
        engine = self.engine_for(model, backend)
        if not self.scheduler.has_runner(engine.name, model.id, mode):
            engine.require_installed()
        return await self.scheduler.acquire(
            engine, model_for_engine(self.store, model, name), mode, keep_alive
        )

    async def call(
        self,
        name: str,
        path: str,
        body: dict[str, Any],
        mode: Mode = Mode.COMPLETION,
        keep_alive: float | None = None,
        backend: str | None = None,
    ) -> EngineCall:
        """POST `body` to `path` of the model's runner; the answer's head is read, its body not yet."""
        started = time.monotonic()
        runner = await self.acquire(name, mode, keep_alive, backend)
        load_seconds = time.monotonic() - started
        call = EngineCall(self.scheduler, runner, load_seconds)
        try:
            await call.send(path, json.dumps(body).encode())
            await call.raise_for_status()  # errors are HTTP statuses, before any streaming starts
        except BaseException:
            await call.close()
            raise
        return call


class EngineCall:
    """One request to a runner. Always `close()` it: that closes the connection and releases the runner."""

    def __init__(self, scheduler: Scheduler, runner: Runner, load_seconds: float) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.load_seconds = load_seconds
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._released = False

    async def send(self, path: str, body: bytes) -> None:
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(
                str(self.runner.socket), limit=MAX_HEAD
            )
            head = (
                f"POST {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            )
            self._writer.write(head.encode() + body)
            await self._writer.drain()
            self.status, self.headers = await read_head(self._reader)
        except (OSError, UpstreamError) as exc:
            raise ModelRunnerError(f"the engine is not reachable: {exc}") from None

    def chunks(self) -> AsyncIterator[bytes]:
        assert self._reader is not None
        return body_chunks(self._reader, self.headers)

    async def read(self, limit: int = MAX_JSON_BODY) -> bytes:
        data = bytearray()
        try:
            async for chunk in self.chunks():
                data += chunk
                if len(data) > limit:
                    raise ModelRunnerError("the engine's answer is too large")
        except (UpstreamError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            raise ModelRunnerError(f"the engine stopped while answering: {exc}") from None
        return bytes(data)

    async def raise_for_status(self) -> None:
        if self.status >= 400:
            body = await self.read(MAX_ERROR_BODY)
            raise EngineFailed(self.status, engine_error_message(self.status, body))

    async def json(self) -> dict[str, Any]:
        try:
            doc = json.loads(await self.read())
        except (ValueError, UnicodeDecodeError):
            raise ModelRunnerError("the engine sent an answer that is not JSON") from None
        if not isinstance(doc, dict):
            raise ModelRunnerError("the engine sent an unexpected answer")
        return doc

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The `data:` payloads of a server-sent event stream, parsed; ends at `[DONE]` or the stream's end.

        A dying engine becomes a ModelRunnerError, for the caller to report in its API's shape.
        """
        buffer = b""
        try:
            async for chunk in self.chunks():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        return
                    try:
                        doc = json.loads(payload)
                    except (ValueError, UnicodeDecodeError):
                        continue
                    if isinstance(doc, dict):
                        if "error" in doc and "choices" not in doc:
                            raise ModelRunnerError(engine_error_message(500, payload))
                        yield doc
        except (UpstreamError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            raise ModelRunnerError(f"the engine stopped while answering: {exc}") from None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
            self._writer = None
        if not self._released:
            self._released = True
            await self.scheduler.release(self.runner)
