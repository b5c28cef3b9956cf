"""The daemon served by uvicorn in a background thread of the test process, with engines chosen by the
test (e.g. tests/fake_engine.FakeEngine). Everything but the engine is the real thing: HTTP on a real
port, the scheduler, engine processes, the store."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from modelrunner import eventlog
from modelrunner.engines.base import Engine
from modelrunner.server.app import Daemon, build_daemon
from modelrunner.server.daemon import daemon_server, uvicorn_config
from modelrunner.store.store import ModelStore
from tests.daemon import free_port
from tests.waiting import wait_until


class InProcessDaemon:
    def __init__(
        self, home: Path, engines: Mapping[str, Engine], front: bool | None = True, **limits: Any
    ) -> None:
        self.home = home
        self.front = front
        self.engines = engines
        self.limits = limits
        self.port = free_port()
        self.daemon: Daemon | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> InProcessDaemon:
        self.daemon = build_daemon(ModelStore(self.home / "models"), self.engines)
        for name, value in self.limits.items():
            setattr(self.daemon.scheduler.limits, name, value)
        config = uvicorn_config(self.daemon, "127.0.0.1", self.port, self.front)
        self._server = daemon_server(self.daemon, config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the in-process daemon did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(30)

    def http(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("timeout", 60)
        return httpx.request(method, self.url + path, **kwargs)

    def ps(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.http("GET", "/engines/ps").json()
        return result

    def wait_for(self, condition: Any, what: str, timeout: float = 30) -> None:
        wait_until(condition, what, timeout)


class AccessLines(logging.Handler):
    """Formats each record where it is written: the request id is a context variable of that task."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(eventlog.LogfmtFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextlib.contextmanager
def access_lines() -> Iterator[AccessLines]:
    """The access log's lines while the block runs, at INFO whatever the level was."""
    lines = AccessLines()
    access = logging.getLogger("modelrunner.access")
    access.addHandler(lines)
    level = access.level
    access.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        access.removeHandler(lines)
        access.setLevel(level)
