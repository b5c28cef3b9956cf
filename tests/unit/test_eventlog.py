"""Structured log lines (modelrunner/eventlog.py): one line per event, logfmt fields, the request id."""

from __future__ import annotations

import io
import logging
import os
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
