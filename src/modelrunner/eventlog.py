"""Structured log lines: one line per event, `key=value` fields (logfmt), the request id on every line.

    2026-12-01T08:46:14.123Z INFO scheduler event=load rid=4f2a9c01d3e8b7a6 model=ai/gemma3:270m

`event(log, "load", model=..., mode=...)` writes such a line. The request id lives in a context variable, so
every line written while a request is handled carries it without being passed around; the front sets it
when a request arrives and returns it to the client as the `X-Request-Id` header.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import logging
import os
import re
import stat
import sys
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any, TextIO

from modelrunner.wire import REQUEST_ID_HEADER as REQUEST_ID_HEADER  # the front and lifecycle set it

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_BACKUPS = 3

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_installed: list[LineHandler] = []  # the handlers of setup(), which event() may write to directly
_QUOTED = re.compile(r'[ "=\\]')  # what a bare value may not hold (unprintable characters neither)


def new_request_id() -> str:
    return os.urandom(8).hex()  # secrets.token_hex's own source, without its two calls around it


def event(
    log: logging.Logger, name: str, level: int = logging.INFO, *, soon: bool = False, **fields: object
) -> None:
    """One structured line: `event=<name>` and the fields in the order given (None values left out).
    `soon`: the line may wait for the end of the event loop's turn (LineHandler.put), for a line on the way
    of a request to its engine.

    Where the line would reach setup()'s handlers and nothing else, it is formatted and written to them
    here: the same line as logging would write, without the LogRecord and logging's dispatch, which cost
    about a third of a line's ~16 us (two lines per request). Otherwise (a test's caplog, a filter, a
    handler added elsewhere) logging dispatches it as usual.
    """
    if not log.isEnabledFor(level):
        return
    handlers = _direct_handlers(log)
    if handlers is None:
        log.log(level, name, extra={"fields": fields, "soon": soon})
        return
    line = logfmt_line(time.time(), logging.getLevelName(level), log.name, name, fields)
    for handler in handlers:
        if level >= handler.level:
            lock = handler.lock
            assert lock is not None  # made by Handler.__init__
            with lock:
                try:
                    handler.put(line, level, soon)
                except Exception:
                    handler.handleError(logging.LogRecord(log.name, level, "", 0, name, None, None))


def _direct_handlers(log: logging.Logger) -> list[LineHandler] | None:
    """setup()'s handlers when a line of `log` reaches them alone and unchanged: no filter, no other handler
    and no `propagate = False` on its way to the root logger; None otherwise."""
    root = logging.root
    if not _installed or root.handlers != _installed or root.filters or log.disabled:
        return None
    while log is not root:
        if log.handlers or log.filters or not log.propagate or log.parent is None:
            return None
        log = log.parent
    for handler in _installed:
        if handler.filters:
            return None
    return _installed


def quote(value: object) -> str:
    """A logfmt value: bare when it is one plain word, else double-quoted with escapes (one line always)."""
    if type(value) is int:
        return str(value)
    text = value if isinstance(value, str) else str(value)
    if text and text.isprintable() and _QUOTED.search(text) is None:
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in escaped) + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        """The record's line, made once however many handlers write it."""
        line: str | None = getattr(record, "logfmt", None)
        if line is None:
            fields: dict[str, object] | None = getattr(record, "fields", None)
            exc = self.formatException(record.exc_info) if record.exc_info else None
            if fields is None:
                line = logfmt_line(
                    record.created, record.levelname, record.name, None, record.getMessage(), exc
                )
            else:
                line = logfmt_line(
                    record.created, record.levelname, record.name, str(record.msg), fields, exc
                )
            record.logfmt = line
        return line


_stamp: tuple[int, str] = (-1, "")  # the last second stamped, and its text (one tuple: threads share it)


def logfmt_line(
    created: float,
    level: str,
    logger: str,
    event_name: str | None,
    fields_or_message: dict[str, object] | str,
    exc: str | None = None,
) -> str:
    """A line: time stamp (UTC, milliseconds), level, logger, `event=<name>` when it is an event, the request
    id, then the event's fields (None values left out) or `msg=<message>`, then `exc=` a traceback."""
    global _stamp
    second, stamp = int(created), _stamp
    if stamp[0] != second:
        stamp = _stamp = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    parts = [f"{stamp[1]}.{int((created - second) * 1000):03d}Z", level, logger.removeprefix("modelrunner.")]
    if event_name is not None:
        parts.append("event=" + quote(event_name))
    rid = request_id.get()
    if rid is not None:
        parts.append("rid=" + rid)
    if isinstance(fields_or_message, str):
        parts.append("msg=" + quote(fields_or_message))
    else:
        parts += [f"{key}={quote(value)}" for key, value in fields_or_message.items() if value is not None]
    if exc:
        parts.append("exc=" + quote(exc))
    return " ".join(parts)


def log_level() -> int:
    """`MODEL_RUNNER_LOG_LEVEL` (or DMR's `LOG_LEVEL`): debug, info, warning or error; info by default."""
    raw = (os.environ.get("MODEL_RUNNER_LOG_LEVEL") or os.environ.get("LOG_LEVEL") or "info").upper()
    level = logging.getLevelName(raw)
    if not isinstance(level, int):
        raise ValueError(f"MODEL_RUNNER_LOG_LEVEL must be debug, info, warning or error, got {raw.lower()!r}")
    return level


def log_max_bytes() -> int:
    """Size at which a log file is rotated: `MODEL_RUNNER_LOG_MAX_BYTES`, 10 MiB by default."""
    return int(os.environ.get("MODEL_RUNNER_LOG_MAX_BYTES") or DEFAULT_MAX_BYTES)


class LineHandler(logging.Handler, abc.ABC):
    """A handler of whole lines: `write(line)` writes one, formatted by LogfmtFormatter (event() hands lines
    to setup()'s handlers directly).

    A line put `soon` on a thread that runs an event loop waits for the end of the loop's turn: a request's
    `reuse` line, which cost two writes (file and stderr) before its engine got the request, goes after it.
    Every other line writes what waits, then itself, at once, so the order of lines holds, and a line that
    waits goes out with the request's access line at the latest, or when the loop next waits for I/O, or
    at flush() and close(). Only lines written at once survive the process's end within the same turn
    (uvicorn ends a daemon stopped by SIGTERM by raising the signal again, inside the loop)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting: list[str] = []
        self._flush_on: asyncio.AbstractEventLoop | None = None  # the loop whose turn ends with a flush

    @abc.abstractmethod
    def write(self, line: str) -> None:
        """Write `line` and its newline (`line` may be several, joined by newlines)."""

    def put(self, line: str, level: int, soon: bool) -> None:
        """Write `line` now, or (`soon`, below a warning) at the end of the running event loop's turn. The
        caller holds self.lock."""
        loop = asyncio._get_running_loop() if soon and level < logging.WARNING else None
        if loop is None:
            self._write_waiting()
            self.write(line)
            return
        self._waiting.append(line)
        if self._flush_on is not loop:  # the loop, not a flag: a loop closed mid-turn never flushes
            self._flush_on = loop
            loop.call_soon(self._end_of_turn)

    def _end_of_turn(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # made by Handler.__init__
            self._flush_on = None
            try:
                self._write_waiting()
            except Exception:
                self.handleError(logging.LogRecord("modelrunner", logging.INFO, "", 0, "", None, None))

    def _write_waiting(self) -> None:
        if self._waiting:
            lines, self._waiting = self._waiting, []
            self.write("\n".join(lines))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.put(self.format(record), record.levelno, getattr(record, "soon", False))
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_waiting()
            super().flush()

    def close(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            try:
                self._write_waiting()
            finally:
                super().close()


class SizeRotatingFileHandler(LineHandler, RotatingFileHandler):
    """RotatingFileHandler that counts the bytes it writes, instead of asking the file system on every line
    (two stat calls and a seek: an access line is written per request), and writes each line with one
    write(2) to its O_APPEND file, not through a text stream's buffer and a flush."""

    def __init__(self, filename: Path, max_bytes: int, backups: int) -> None:
        super().__init__(filename, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)
        self.size: int | None = None  # of the open file, counted from when it was opened

    def write(self, line: str) -> None:
        size = self._open_size()
        if self.maxBytes > 0 and size + len(line) + 1 >= self.maxBytes:
            self.doRollover()
            size = self._open_size()
        assert self.stream is not None
        self.size = size + write_line(self.stream.fileno(), line)

    def _open_size(self) -> int:
        """The open file's size (the file opened first if it is not)."""
        if self.stream is None:
            self.stream = self._open()
            self.size = None
        if self.size is None:
            # a log file that is not a regular one (/dev/stdout, a pipe) is never rotated, as in logging
            regular = stat.S_ISREG(os.fstat(self.stream.fileno()).st_mode)
            self.size = self.stream.seek(0, os.SEEK_END) if regular else -(2**62)
        return self.size


class StderrHandler(LineHandler, logging.StreamHandler):  # type: ignore[type-arg]
    """Lines to the process's stderr, each with one write(2) where it has a file (a StreamHandler writes
    through the text stream's buffer, then flushes it: several microseconds more per line)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        try:
            self.fd: int | None = stream.fileno()
        except (AttributeError, OSError, ValueError):  # an object without a file (a test's capture)
            self.fd = None

    def write(self, line: str) -> None:
        if self.fd is None:
            self.stream.write(line + self.terminator)
            self.flush()
        else:
            write_line(self.fd, line)


def write_line(fd: int, line: str) -> int:
    """Write `line` and a newline (whole, even if the kernel takes it in parts); returns the bytes written."""
    data = (line + "\n").encode("utf-8", "backslashreplace")
    written = os.write(fd, data)
    while written < len(data):
        written += os.write(fd, data[written:])
    return len(data)


def setup(log_file: Path, level: int | None = None, stderr: bool = True) -> None:
    """Structured lines to `log_file`, rotated by size (`MODEL_RUNNER_LOG_MAX_BYTES`), and to stderr unless
    told not to."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    # what a LogRecord would look up for every line and no line shows: the caller's frame, the process
    # and thread (the logging HOWTO's "Optimization")
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handlers: list[LineHandler] = [SizeRotatingFileHandler(log_file, log_max_bytes(), DEFAULT_BACKUPS)]
    if stderr:
        handlers.insert(0, StderrHandler(sys.stderr))
    formatter = LogfmtFormatter()
    root = logging.getLogger()
    root.handlers.clear()
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(log_level() if level is None else level)
    _installed[:] = handlers
