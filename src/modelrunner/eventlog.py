"""Structured log lines: one line per event, `key=value` fields (logfmt), the request id on every line.

    2026-12-01T08:46:14.123Z INFO scheduler event=load rid=4f2a9c01d3e8b7a6 model=ai/gemma3:270m

`event(log, "load", model=..., mode=...)` writes such a line. The request id lives in a context variable, so
every line written while a request is handled carries it without being passed around; the front sets it
when a request arrives and returns it to the client as the `X-Request-Id` header.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import stat
import sys
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import TextIO

from modelrunner.wire import REQUEST_ID_HEADER as REQUEST_ID_HEADER  # the front and lifecycle set it

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_BACKUPS = 3

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_QUOTED = re.compile(r'[ "=\\]')  # what a bare value may not hold (unprintable characters neither)


def new_request_id() -> str:
    return os.urandom(8).hex()  # secrets.token_hex's own source, without its two calls around it


def event(log: logging.Logger, name: str, level: int = logging.INFO, **fields: object) -> None:
    """One structured line: `event=<name>` and the fields in the order given (None values left out)."""
    if log.isEnabledFor(level):
        log.log(level, name, extra={"fields": fields})


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
    _second = -1  # the second whose time stamp is `_stamp`
    _stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        """The record's line, made once however many handlers write it."""
        line: str | None = getattr(record, "logfmt", None)
        if line is None:
            line = record.logfmt = self._line(record)
        return line

    def _line(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        parts = [
            f"{self._stamp}.{int(record.msecs):03d}Z",
            record.levelname,
            record.name.removeprefix("modelrunner."),
        ]
        fields: dict[str, object] | None = getattr(record, "fields", None)
        if fields is not None:
            parts.append("event=" + quote(record.msg))
        rid = request_id.get()
        if rid is not None:
            parts.append("rid=" + rid)
        if fields is not None:
            parts += [f"{key}={quote(value)}" for key, value in fields.items() if value is not None]
        else:
            parts.append("msg=" + quote(record.getMessage()))
        if record.exc_info:
            parts.append("exc=" + quote(self.formatException(record.exc_info)))
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


class SizeRotatingFileHandler(RotatingFileHandler):
    """RotatingFileHandler that counts the bytes it writes, instead of asking the file system on every line
    (two stat calls and a seek: an access line is written per request), and writes each line with one
    write(2) to its O_APPEND file, not through a text stream's buffer and a flush."""

    def __init__(self, filename: Path, max_bytes: int, backups: int) -> None:
        super().__init__(filename, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)
        self.size: int | None = None  # of the open file, counted from when it was opened

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.stream is None:
            self.stream = self._open()
        if self.size is None:
            # a log file that is not a regular one (/dev/stdout, a pipe) is never rotated, as in logging
            regular = stat.S_ISREG(os.fstat(self.stream.fileno()).st_mode)
            self.size = self.stream.seek(0, os.SEEK_END) if regular else -(2**62)
        return self.maxBytes > 0 and self.size + len(self.format(record)) + 1 >= self.maxBytes

    def doRollover(self) -> None:
        super().doRollover()
        self.size = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.shouldRollover(record):
                self.doRollover()
            if self.stream is None:
                self.stream = self._open()
            self.size = (self.size or 0) + write_line(self.stream.fileno(), self.format(record))
        except Exception:
            self.handleError(record)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Lines to the process's stderr, each with one write(2) where it has a file (a StreamHandler writes
    through the text stream's buffer, then flushes it: several microseconds more per line)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        try:
            self.fd: int | None = stream.fileno()
        except (AttributeError, OSError, ValueError):  # an object without a file (a test's capture)
            self.fd = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.fd is None:
            super().emit(record)
            return
        try:
            write_line(self.fd, self.format(record))
        except Exception:
            self.handleError(record)


def write_line(fd: int, line: str) -> int:
    """Write `line` and a newline (whole, even if the kernel takes it in parts); returns the bytes written."""
    data = (line + "\n").encode("utf-8", "backslashreplace")
    written = os.write(fd, data)
    while written < len(data):
        written += os.write(fd, data[written:])
    return len(data)


def setup(log_file: Path, level: int | None = None) -> None:
    """Structured lines to stderr and to `log_file`, rotated by size (`MODEL_RUNNER_LOG_MAX_BYTES`)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    # what a LogRecord would look up for every line and no line shows: the caller's frame, the process
    # and thread (the logging HOWTO's "Optimization")
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handlers: list[logging.Handler] = [
        StderrHandler(sys.stderr),
        SizeRotatingFileHandler(log_file, log_max_bytes(), DEFAULT_BACKUPS),
    ]
    formatter = LogfmtFormatter()
    root = logging.getLogger()
    root.handlers.clear()
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(log_level() if level is None else level)
