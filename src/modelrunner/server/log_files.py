"""What `GET /logs` streams: daemon.log, then each engine's log, read in chunks (never whole), optionally
followed as they grow (also across rotation) and filtered to the lines about one model."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from modelrunner.errors import ModelRunnerError
from modelrunner.store.store import ModelStore, full_tag

CHUNK = 64 * 1024
FOLLOW_POLL = 0.2  # seconds between looks at the files while following
_MODEL_FIELD = re.compile(rb'(?:^| )model=("(?:[^"\\]|\\.)*"|\S+)')


def normal_name(name: str) -> str:
    """A model name in its full form (`tiny` -> `docker.io/ai/tiny:latest`); as it is when it is none."""
    try:
        return full_tag(name)
    except ModelRunnerError:
        return name


class ModelFilter:
    """Which log lines are about one model: daemon lines whose `model=` names it (by any of its names),
    and the engine logs of its runners (named after its ID)."""

    def __init__(self, store: ModelStore, name: str) -> None:
        self.store = store
        self.wanted = normal_name(name)
        try:
            self.model_id: str | None = store.get(name).id
        except ModelRunnerError:
            self.model_id = None  # removed since: its lines are still found by name
        self._seen: dict[bytes, bool] = {}

    def engine_log(self, path: Path) -> bool:
        return self.model_id is not None and self.model_id.removeprefix("sha256:")[:12] in path.name

    def line(self, line: bytes) -> bool:
        match = _MODEL_FIELD.search(line)
        if match is None:
            return False
        value = match.group(1)
        if value not in self._seen:
            self._seen[value] = self._names_it(value.strip(b'"').decode("utf-8", "replace"))
        return self._seen[value]

    def _names_it(self, name: str) -> bool:
        if normal_name(name) == self.wanted:
            return True
        try:
            return self.model_id is not None and self.store.get(name).id == self.model_id
        except ModelRunnerError:
            return False


@dataclass
class _Tail:
    """Where one file was read up to: its identity (a rotated file is a new inode) and offset."""

    inode: int = -1
    offset: int = 0
    partial: bytes = b""  # an unfinished last line, held back when filtering by line


def _read_from(path: Path, offset: int) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        handle.seek(offset)
        while chunk := handle.read(CHUNK):
            yield chunk


class LogStreamer:
    def __init__(
        self,
        logs_dir: Path,
        engines: bool,
        model: ModelFilter | None,
        disconnected: Callable[[], Awaitable[bool]],
    ) -> None:
        self.logs_dir = logs_dir
        self.engines = engines
        self.model = model
        self.disconnected = disconnected  # whether the client left (while following)
        self.tails: dict[Path, _Tail] = {}

    def files(self) -> list[Path]:
        found = [self.logs_dir / "daemon.log"]
        if self.engines:
            engine_logs = sorted(self.logs_dir.glob("engine-*.log"))
            if self.model is not None:
                engine_logs = [p for p in engine_logs if self.model.engine_log(p)]
            found += engine_logs
        return found

    def _new_bytes(self, path: Path) -> Iterator[bytes]:
        """What `path` gained since the last look: after a rotation, the rest of the rotated file first."""
        tail = self.tails.setdefault(path, _Tail())
        try:
            st = path.stat()
        except OSError:
            return
        if tail.inode not in (-1, st.st_ino):
            rotated = path.with_name(path.name + ".1")
            try:
                if rotated.stat().st_ino == tail.inode:
                    yield from _read_from(rotated, tail.offset)
            except OSError:
                pass
            tail.offset = 0
        elif st.st_size < tail.offset:  # truncated
            tail.offset = 0
        tail.inode = st.st_ino
        try:
            for chunk in _read_from(path, tail.offset):
                tail.offset += len(chunk)
                yield chunk
        except OSError:
            return

    def _filtered(self, path: Path, chunk: bytes, final: bool) -> bytes:
        if self.model is None or path.name.startswith("engine-"):
            return chunk  # an engine log is already the model's own
        tail = self.tails[path]
        lines = (tail.partial + chunk).split(b"\n")
        tail.partial = b"" if final else lines.pop()
        return b"".join(line + b"\n" for line in lines if line and self.model.line(line))

    def _pass(self, final: bool) -> Iterator[bytes]:
        for path in self.files():
            for chunk in self._new_bytes(path):
                data = self._filtered(path, chunk, final=False)
                if data:
                    yield data
            if final and path in self.tails and self.tails[path].partial:
                data = self._filtered(path, b"", final=True)
                if data:
                    yield data

    async def stream(self, follow: bool) -> AsyncIterator[bytes]:
        for data in self._pass(final=not follow):
            yield data
            await asyncio.sleep(0)  # a large file does not hold the event loop
        while follow and not await self.disconnected():
            await asyncio.sleep(FOLLOW_POLL)
            for data in self._pass(final=False):
                yield data
