"""Stand-ins for the serving classes' unit tests (tests/unit/test_*_serving.py), which call the API logic
without HTTP: an engine call that answers scripted chat-completion chunks, a JSON answer or raw bytes, and
a scheduler that records what it was asked to unload."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from modelrunner.engines.base import Mode
from modelrunner.errors import ModelRunnerError


class FakeCall:
    """What server/served_call.ServedCall offers the serving classes: the answer, then `close()`; it is
    its own engine call (`engine`: the bytes, a count beside them)."""

    def __init__(
        self,
        events: list[dict[str, Any]] | None = None,
        answer: dict[str, Any] | None = None,
        fail: ModelRunnerError | None = None,
        raw: tuple[int, bytes] = (200, b"{}"),
        path: str = "",
    ) -> None:
        self._events = events or []
        self._answer = answer or {}
        self._raw = raw  # the answer as the engine sent it, status included
        self._fail = fail  # raised after the events, as an engine that dies mid-stream
        self.load_seconds = 0.0
        self.path = path  # the engine's path: chat completions for Messages served through chat
        self.tools: dict[str, Any] | None = None  # none declared: nothing rescued (compat/tool_rescue.py)
        self.unopened = False  # an assembled message that lacked message_start
        self.closed = False
        self.engine = self

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        for event in self._events:
            yield event
        if self._fail is not None:
            raise self._fail

    async def json(self) -> dict[str, Any]:
        return self._answer

    async def answer(self) -> tuple[int, bytes]:
        return self._raw

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._raw[1]

    async def beside(self, path: str, body: bytes) -> bytes | None:
        return None  # a request beside the call (a count of tokens) that got no answer

    async def close(self) -> None:
        self.closed = True


class EngineCalls:
    """`call_engine` replaced in a serving module: each call answers with the next FakeCall, and what was
    sent (model, path, body, mode, keep_alive, backend) is kept."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any, *answers: FakeCall) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, str, dict[str, Any], Mode, float | None, str | None]] = []
        monkeypatch.setattr(module, "call_engine", self._call)

    async def _call(
        self,
        ctx: Any,
        name: str,
        path: str,
        body: dict[str, Any],
        mode: Mode = Mode.COMPLETION,
        keep_alive: float | None = None,
        backend: str | None = None,
    ) -> FakeCall:
        self.sent.append((name, path, body, mode, keep_alive, backend))
        return self.answers.pop(0)


class FakeSettings:
    def __init__(self) -> None:
        self.stored: dict[tuple[str, str, Mode], Any] = {}

    def get(self, engine: str, model_id: str, mode: Mode) -> Any:
        return self.stored.get((engine, model_id, mode))

    def put(self, engine: str, model_id: str, mode: Mode, settings: Any) -> None:
        self.stored[(engine, model_id, mode)] = settings

    def all(self) -> list[tuple[str, str, Mode, Any]]:
        return [(*key, settings) for key, settings in self.stored.items()]


class FakeScheduler:
    """Runners as `ps()` lists them (`running`); what it was asked to unload is kept."""

    def __init__(self, running: list[dict[str, Any]] | None = None) -> None:
        self.unloaded: list[tuple[set[str] | None, str | None]] = []
        self.running = running or []
        self.runners: dict[Any, Any] = {}
        self.settings = FakeSettings()

    async def unload(self, model_ids: set[str] | None, backend: str | None = None, **_: Any) -> int:
        self.unloaded.append((model_ids, backend))
        return len(model_ids or ())

    def ps(self, draft_counts: Any = None) -> list[dict[str, Any]]:
        return self.running


async def collect(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([piece async for piece in stream])
