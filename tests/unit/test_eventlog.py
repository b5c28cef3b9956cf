"""Structured log lines (modelrunner/eventlog.py): one line per event, logfmt fields, the request id."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner import eventlog


def formatted(name: str, **fields: object) -> str:
    record = logging.LogRecord("modelrunner.scheduler", logging.INFO, __file__, 1, name, None, None)
    record.fields = fields
    return eventlog.LogfmtFormatter().format(record)


def test_an_event_is_one_logfmt_line_with_the_request_id() -> None:
    token = eventlog.request_id.set("0123456789abcdef")
    try:
        line = formatted("load", model="ai/x:latest", argv="llama-server -m a", skipped=None, n=3)
    finally:
        eventlog.request_id.reset(token)
    assert line.split(" ", 3)[1:3] == ["INFO", "scheduler"]
    assert line.endswith('event=load rid=0123456789abcdef model=ai/x:latest argv="llama-server -m a" n=3')


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        ("", '""'),
        ("two words", '"two words"'),
        ('a"b', '"a\\"b"'),
        ("line\nbreak", '"line\\nbreak"'),
        ("k=v", '"k=v"'),
        ("bell\x07", '"bell\\x07"'),
        (1.5, "1.5"),
    ],
)
def test_values_are_quoted_so_that_a_line_stays_one_line(value: object, expected: str) -> None:
    assert eventlog.quote(value) == expected


def test_a_plain_message_and_an_exception_stay_on_one_line() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "modelrunner.x", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info()
        )
    line = eventlog.LogfmtFormatter().format(record)
    assert "\n" not in line
    assert 'msg="failed here"' in line and "ValueError" in line


def test_the_level_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_RUNNER_LOG_LEVEL", "debug")
    assert eventlog.log_level() == logging.DEBUG
    monkeypatch.setenv("MODEL_RUNNER_LOG_LEVEL", "loud")
    with pytest.raises(ValueError, match="MODEL_RUNNER_LOG_LEVEL"):
        eventlog.log_level()


def test_both_handlers_write_whole_lines_and_the_file_rotates_by_bytes(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    stderr = os.fdopen(write_end, "w")
    handlers = [
        eventlog.StderrHandler(stderr),
        eventlog.SizeRotatingFileHandler(tmp_path / "daemon.log", max_bytes=400, backups=2),
    ]
    log = logging.getLogger("modelrunner.test-handlers")
    log.propagate = False
    log.setLevel(logging.INFO)
    for handler in handlers:
        handler.setFormatter(eventlog.LogfmtFormatter())
        log.addHandler(handler)
    try:
        for n in range(6):
            eventlog.event(log, "request", n=n, path="/v1/chat/completions", note="é")
    finally:
        for handler in handlers:
            log.removeHandler(handler)
            handler.close()
        stderr.close()
    with os.fdopen(read_end, "rb") as pipe:
        piped = pipe.read().decode().splitlines()
    assert [line.split("n=")[1].split()[0] for line in piped] == [str(n) for n in range(6)]
    logged = [
        *(tmp_path / "daemon.log.1").read_text().splitlines(),
        *(tmp_path / "daemon.log").read_text().splitlines(),
    ]
    assert logged == piped[-len(logged) :] and len(logged) >= 2  # the oldest rotated out of the two kept
    assert all((tmp_path / name).stat().st_size <= 400 for name in ("daemon.log", "daemon.log.1"))


def test_a_stderr_without_a_file_gets_lines_through_its_write() -> None:
    handler = eventlog.StderrHandler(io.StringIO())
    handler.setFormatter(eventlog.LogfmtFormatter())
    record = logging.LogRecord("modelrunner.x", logging.INFO, __file__, 1, "ready", None, None)
    record.fields = {"model": "m"}
    handler.emit(record)
    assert handler.stream.getvalue().endswith("event=ready model=m\n")


@contextlib.contextmanager
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stderr: bool = True) -> Iterator[None]:
    """eventlog.setup() on the root logger, as the daemon has it (pytest's own capture handlers taken off
    the root meanwhile), with a stderr of its own (tmp_path/stderr.log); undone afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, eventlog._installed[:])
    monkeypatch.setenv("MODEL_RUNNER_LOG_MAX_BYTES", "600")
    with open(tmp_path / "stderr.log", "a") as stream:
        monkeypatch.setattr(sys, "stderr", stream)
        eventlog.setup(tmp_path / "logs" / "daemon.log", stderr=stderr)
        try:
            yield
        finally:
            for handler in eventlog._installed:
                handler.close()
            root.handlers[:], eventlog._installed[:] = saved[0], saved[2]
            root.setLevel(saved[1])


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_event_written_directly_is_the_line_logging_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """event() writes to setup()'s handlers itself when nothing else would see the line; with another
    handler on the root logger (a test's caplog) logging dispatches it, and the line is the same."""
    log = logging.getLogger("modelrunner.scheduler")
    other = Captured()
    token = eventlog.request_id.set("0123456789abcdef")
    with installed(tmp_path, monkeypatch):
        assert eventlog._direct_handlers(log) is not None
        eventlog.event(log, "reuse", model="ai/x", note="two words", skipped=None, pid=7)
        logging.getLogger().addHandler(other)
        try:
            assert eventlog._direct_handlers(log) is None
            eventlog.event(log, "reuse", model="ai/x", note="two words", skipped=None, pid=7)
        finally:
            logging.getLogger().removeHandler(other)
        log.setLevel(logging.WARNING)  # below the level: nothing, either way
        try:
            eventlog.event(log, "reuse", model="ai/y")
        finally:
            log.setLevel(logging.NOTSET)
            eventlog.request_id.reset(token)
    assert [record.msg for record in other.records] == ["reuse"]
    for name in ("stderr.log", "logs/daemon.log"):
        direct, dispatched = (tmp_path / name).read_text().splitlines()
        assert direct.split(" ", 1)[1] == dispatched.split(" ", 1)[1]  # all but the time stamp
        assert direct.endswith('event=reuse rid=0123456789abcdef model=ai/x note="two words" pid=7')
        assert direct.split(" ", 3)[1:3] == ["INFO", "scheduler"]


def test_lines_written_directly_rotate_the_file_by_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = logging.getLogger("modelrunner.scheduler")
    with installed(tmp_path, monkeypatch):
        for n in range(30):
            eventlog.event(log, "request", n=n, path="/v1/chat/completions")
    logs = tmp_path / "logs"
    kept = [
        *(logs / "daemon.log.3").read_text().splitlines(),
        *(logs / "daemon.log.2").read_text().splitlines(),
        *(logs / "daemon.log.1").read_text().splitlines(),
        *(logs / "daemon.log").read_text().splitlines(),
    ]
    everything = (tmp_path / "stderr.log").read_text().splitlines()
    assert kept == everything[-len(kept) :] and len(everything) == 30 > len(kept)  # the oldest rotated out
    assert sorted(path.name for path in logs.iterdir()) == [
        "daemon.log",
        *(f"daemon.log.{n}" for n in (1, 2, 3)),
    ]
    assert all(path.stat().st_size <= 600 for path in logs.iterdir())


def test_a_daemon_told_not_to_keeps_its_lines_off_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with installed(tmp_path, monkeypatch, stderr=False):
        assert [type(h) for h in logging.getLogger().handlers] == [eventlog.SizeRotatingFileHandler]
        eventlog.event(logging.getLogger("modelrunner.scheduler"), "ready", model="m")
    assert (tmp_path / "logs" / "daemon.log").read_text().endswith("event=ready model=m\n")
    assert (tmp_path / "stderr.log").read_text() == ""


def test_lines_put_soon_wait_for_the_end_of_the_loops_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an event loop's thread a line logged `soon` waits for the end of the turn, and those of a turn go
    out in one write(2) per handler; any other line (a warning too) writes what waits and itself at once,
    so the order holds."""
    log = logging.getLogger("modelrunner.scheduler")
    daemon_log = tmp_path / "logs" / "daemon.log"
    writes: list[bytes] = []
    real_write = os.write

    def counted(fd: int, data: bytes) -> int:
        writes.append(data)
        return real_write(fd, data)

    seen: dict[str, list[str]] = {}

    def numbers() -> list[str]:
        text = daemon_log.read_text() if daemon_log.exists() else ""
        return [line.rsplit(" ", 1)[1] for line in text.splitlines()]

    async def turn() -> None:
        eventlog.event(log, "reuse", soon=True, n=1)
        eventlog.event(log, "reuse", soon=True, n=2)
        seen["in the turn"] = numbers()
        await asyncio.sleep(0)  # the turn ends
        seen["after it"] = numbers()
        eventlog.event(log, "reuse", soon=True, n=3)
        eventlog.event(logging.getLogger("modelrunner.access"), "request", n=4)
        seen["after a line at once"] = numbers()
        eventlog.event(log, "reuse", soon=True, n=5)
        eventlog.event(log, "refused", logging.WARNING, soon=True, n=6)
        seen["after a warning"] = numbers()

    with installed(tmp_path, monkeypatch, stderr=False):
        monkeypatch.setattr(os, "write", counted)
        asyncio.run(turn())
    assert seen == {
        "in the turn": [],
        "after it": ["n=1", "n=2"],
        "after a line at once": ["n=1", "n=2", "n=3", "n=4"],
        "after a warning": ["n=1", "n=2", "n=3", "n=4", "n=5", "n=6"],
    }
    assert [data.count(b"\n") for data in writes] == [2, 1, 1, 1, 1]  # the turn's two lines: one write


def test_lines_waiting_when_their_loop_closes_are_written_by_the_next_line_or_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that stops before its turn ends leaves its lines waiting: a line of another thread writes them
    first, a next loop flushes them with its own, and close() (logging.shutdown at exit) writes the rest."""
    log = logging.getLogger("modelrunner.scheduler")
    daemon_log = tmp_path / "logs" / "daemon.log"

    def numbers() -> list[str]:
        return [line.rsplit(" ", 1)[1] for line in daemon_log.read_text().splitlines()]

    async def log_and_stop(n: int) -> None:
        eventlog.event(log, "reuse", soon=True, n=n)
        asyncio.get_running_loop().stop()  # the loop stops: its turn's flush never runs

    def left_waiting(n: int) -> None:
        loop = asyncio.new_event_loop()
        try:
            task = loop.create_task(log_and_stop(n))
            loop.run_forever()
            assert task.done()
        finally:
            loop.close()

    async def logs(n: int) -> None:
        eventlog.event(log, "reuse", soon=True, n=n)
        await asyncio.sleep(0)

    with installed(tmp_path, monkeypatch, stderr=False):
        left_waiting(1)
        left_waiting(2)
        assert not daemon_log.exists()  # both wait
        thread = threading.Thread(target=eventlog.event, args=(log, "request"), kwargs={"soon": True, "n": 3})
        thread.start()
        thread.join()
        assert numbers() == ["n=1", "n=2", "n=3"]  # no loop on that thread: at once
        left_waiting(4)
        asyncio.run(logs(5))
        assert numbers() == ["n=1", "n=2", "n=3", "n=4", "n=5"]
        left_waiting(6)
        assert len(numbers()) == 5
    assert numbers() == ["n=1", "n=2", "n=3", "n=4", "n=5", "n=6"]  # installed() closes the handlers
