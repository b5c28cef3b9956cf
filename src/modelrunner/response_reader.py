"""The one HTTP/1.x response reader: sans-IO, bytes in; the head, the body's data as spans of those bytes,
and its end out. Every part that reads an answer uses it: the HTTP front's relay (server/front.py), the
engine calls (http1.py), the CLI's client (client_http.py); the C relay (_relay.c) follows the same chunked
framing in C for speed and is tested against this reader. Data comes out as (start, end) offsets into the
bytes fed, so a relay can pass on the bytes as framed and still know which of them are data (the recorder
keeps data unframed). No asyncio here: the CLI imports it."""

from __future__ import annotations

from typing import NamedTuple

from modelrunner.chunking import MAX_CHUNK_LINE, chunk_size
from modelrunner.wire import EVENT_END, TAIL, tail_after

MAX_HEAD = 64 * 1024  # a response head (status line and headers) longer than this is refused
MAX_HEADERS = 200
Span = tuple[int, int]


def is_event_stream(content_type: bytes | str) -> bool:
    """Whether a Content-Type names server-sent events (text/event-stream, in any case, any parameters)."""
    if isinstance(content_type, str):
        content_type = content_type.encode("latin-1", "replace")
    return content_type.partition(b";")[0].strip().lower() == b"text/event-stream"


class Head(NamedTuple):
    """A response's status line and headers: names in lower case, values without surrounding spaces. (A
    NamedTuple, not a dataclass: the CLI imports this module, and dataclasses costs it `inspect`.)"""

    version: bytes
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]

    def get(self, name: bytes) -> bytes | None:
        """A header's value (repeated ones joined with ", "), else None."""
        values = [value for key, value in self.headers if key == name]
        return b", ".join(values) if values else None

    @property
    def keep_alive(self) -> bool:
        """The server may take another request on this connection."""
        return self.version == b"HTTP/1.1" and b"close" not in (self.get(b"connection") or b"").lower()

    @property
    def event_stream(self) -> bool:
        return is_event_stream(self.get(b"content-type") or b"")


def _parse_head(data: bytes) -> Head:
    """A head without its blank line; lines may end with a bare LF (as RFC 9112 lets recipients accept);
    obsolete folded lines continue the header before them. ValueError if it is not HTTP/1.x."""
    lines = [line.removesuffix(b"\r") for line in data.split(b"\n")]
    version, status, reason = _status_line(lines[0])
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t") and headers:
            name, value = headers[-1]
            headers[-1] = (name, value + b" " + line.strip())
            continue
        name, colon, value = line.partition(b":")
        if colon:
            headers.append((name.strip().lower(), value.strip()))
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"more than {MAX_HEADERS} headers")
    return Head(version, status, reason, headers)


def _status_line(line: bytes) -> tuple[bytes, int, bytes]:
    parts = line.removesuffix(b"\r").split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise ValueError("not HTTP")
    return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else b""


class ResponseReader:
    """One response, read as its bytes arrive: `feed` each read; it returns the spans of that read that are
    body data. Once `head` is set, `body_start` says where the body began in the read that completed it.
    The body ends by its Content-Length, its chunked framing (RFC 9112, with chunking.chunk_size), or the
    end of the connection (`until_close`: call `feed_eof`). `complete` once it has ended; `excess`: bytes of
    the last read beyond the end. An invalid answer sets `invalid` (why) and `valid`: the bytes of that read
    that may be passed on (its head, and the whole chunks before the invalid bytes; the spans returned
    are theirs), the framing being left as it was there, so `at_boundary` and `tail` describe what was
    passed on. Chunked bodies also keep `tail`, the last data bytes (wire.tail_after: whether an SSE event
    was cut is wire.ends_event's to say), and `at_boundary`: whether what was read so far ends between
    chunks."""

    def __init__(self, *, no_body: bool = False, tail: bytes = EVENT_END) -> None:
        self.no_body = no_body  # the answer to a HEAD request
        self.head: Head | None = None
        self.body_start = 0
        self.chunked = False
        self.until_close = False
        self.complete = False
        self.broken = False  # the body was cut mid-chunk elsewhere (the C relay): it cannot be completed
        self.excess = 0
        self.invalid: str | None = None
        self.valid = 0
        self.tail = tail
        self.remaining = 0  # of a sized body
        self._buffer = bytearray()  # the head, until it is whole
        self._skip = 0  # chunked: bytes before the next size line (the rest of a chunk's data, its CRLF)
        self._line = b""  # chunked: a size or trailer line cut between reads
        self._trailers = False  # chunked: the last chunk came; trailer lines until an empty one

    @property
    def at_boundary(self) -> bool:
        return not (self._skip or self._line or self._trailers or self.broken)

    def feed(self, data: bytes) -> list[Span]:
        """The spans of `data` that are body data, in order."""
        if self.chunked and not self.complete and self.invalid is None:  # a stream's every read: first
            return self._feed_chunked(data, 0)
        if self.invalid is not None:
            return []
        start = 0
        if self.head is None:
            found = self._read_head(data)
            if found is None:
                return []
            start = found
        if self.complete:
            self.excess = len(data) - start
            return []
        if self.chunked:
            return self._feed_chunked(data, start)
        end = len(data)
        if self.until_close:
            return [(start, end)] if start < end else []
        stop = min(end, start + self.remaining)
        self.remaining -= stop - start
        if not self.remaining:
            self.complete = True
            self.excess = end - stop
        return [(start, stop)] if start < stop else []

    def feed_eof(self) -> bool:
        """The connection ended: whether the answer is complete (a body until the close is, then)."""
        if self.until_close and self.head is not None and self.invalid is None:
            self.complete = True
        return self.complete

    # the head

    def _read_head(self, data: bytes) -> int | None:
        """Take the head's bytes; once it is whole, where the body starts in `data`. Interim (1xx) answers
        are passed over."""
        base = len(self._buffer)
        self._buffer += data
        pos = 0
        while True:
            end = _head_end(self._buffer, pos)
            if (end if end >= 0 else len(self._buffer)) - pos > MAX_HEAD:
                self._fail("the response head is too large", 0)
                return None
            try:
                if end < 0:  # not whole yet; its status line, once it came, says whether it is HTTP
                    newline = self._buffer.find(b"\n", pos)
                    if newline >= 0:
                        _status_line(bytes(self._buffer[pos:newline]))
                    return None
                head = _parse_head(bytes(self._buffer[pos:end]).rstrip(b"\r\n"))
                if not 100 <= head.status < 200:
                    self._frame(head)
            except ValueError as exc:
                self._fail(str(exc), 0)
                return None
            pos = end
            if self.head is not None:
                self._buffer = bytearray()
                self.body_start = end - base
                self.valid = self.body_start
                return self.body_start

    def _frame(self, head: Head) -> None:
        """How the body of the answer with this head ends."""
        coding = (head.get(b"transfer-encoding") or b"").lower()
        length = head.get(b"content-length")
        if self.no_body or head.status in (204, 304):
            self.complete = True
        elif coding.rsplit(b",", 1)[-1].strip() == b"chunked":
            self.chunked = True
        elif length is not None:
            if not length.isdigit():
                raise ValueError("invalid content-length")
            self.remaining = int(length)
            self.complete = not self.remaining
        else:
            self.until_close = True
        self.head = head

    def _fail(self, why: str, valid: int) -> None:
        self.invalid = why
        self.valid = valid

    # chunked bodies

    def _feed_chunked(self, data: bytes, start: int) -> list[Span]:
        before = self._skip, self._line, self._trailers, self.tail
        spans: list[Span] = []
        try:
            self._chunks(data, start, spans)
        except _Invalid as exc:
            valid, kept, tail = exc.boundary  # where the last chunk that ended in `data` ends: spans, tail
            del spans[kept:]
            if valid:
                self._skip, self._line, self._trailers, self.tail = 0, b"", False, tail
            else:
                self._skip, self._line, self._trailers, self.tail = before
            self._fail(exc.why, valid or start)
            return spans
        self.valid = len(data)
        return spans

    def _chunks(self, data: bytes, start: int, spans: list[Span]) -> None:
        """Follow the framing over `data` from `start`, adding its data spans to `spans`: one size-line
        parse per chunk, the data skipped over, its CRLF checked. _Invalid says where the last whole chunk
        before the invalid bytes ended."""
        end = len(data)
        pos = start
        boundary = 0, 0, self.tail
        if self._skip:
            left = self._skip - 2  # of the chunk's data; its CRLF follows
            if left > 0:
                stop = min(pos + left, end)
                spans.append((pos, stop))
                self.tail = tail_after(self.tail, data[max(pos, stop - TAIL) : stop])
            pos += self._skip
            _check_crlf(data, pos, boundary)
            if pos >= end:
                self._skip = pos - end
                return
            boundary = pos, len(spans), self.tail
        while pos < end:
            newline = data.find(b"\n", pos)
            if newline < 0 or self._line:
                if newline < 0:
                    self._line += data[pos:]
                    pos = end
                else:
                    self._line += data[pos:newline]
                    pos = newline + 1
                if len(self._line) > MAX_CHUNK_LINE:
                    raise _Invalid("a chunk line is too long", boundary)
                if newline < 0:
                    break
                line, self._line = self._line, b""
            else:
                if newline - pos > MAX_CHUNK_LINE:
                    raise _Invalid("a chunk line is too long", boundary)
                line = data[pos:newline]
                pos = newline + 1
            if not line.endswith(b"\r"):
                raise _Invalid("a chunk line does not end with CRLF", boundary)
            if self._trailers:
                if line == b"\r":  # the empty line after the trailers ends the body
                    self.complete = True
                    self.excess = end - pos
                    self._trailers = False
                    self._skip = 0
                    return
                continue
            try:
                size = chunk_size(line[:-1])
            except ValueError as exc:
                raise _Invalid(str(exc), boundary) from None
            if size == 0:
                self._trailers = True
                continue
            stop = pos + size
            if stop + 2 <= end:  # the whole chunk is in this read: the common case, inline
                spans.append((pos, stop))
                self.tail = tail_after(self.tail, data[max(pos, stop - TAIL) : stop])
                pos = stop + 2
                if data[stop] != 13 or data[stop + 1] != 10:
                    raise _Invalid("no CRLF after a chunk's data", boundary)
                boundary = pos, len(spans), self.tail
                continue
            stop = min(stop, end)
            spans.append((pos, stop))
            self.tail = tail_after(self.tail, data[max(pos, stop - TAIL) : stop])
            pos += size + 2
            _check_crlf(data, pos, boundary)
            if pos <= end:
                boundary = pos, len(spans), self.tail
        self._skip = max(pos - end, 0)


class _Invalid(Exception):
    def __init__(self, why: str, boundary: tuple[int, int, bytes]) -> None:
        super().__init__(why)
        self.why = why
        self.boundary = boundary


def _check_crlf(data: bytes, after: int, boundary: tuple[int, int, bytes]) -> None:
    """The CRLF after a chunk's data, which ends at `after` (an offset in `data`, perhaps beyond it): its
    bytes that are in this read (the others were, or will be, checked with theirs)."""
    cr, lf, end = after - 2, after - 1, len(data)
    if (0 <= cr < end and data[cr] != 13) or (0 <= lf < end and data[lf] != 10):
        raise _Invalid("no CRLF after a chunk's data", boundary)


def _head_end(buffer: bytearray, start: int) -> int:
    """Where the head that starts at `start` ends (after its blank line), or -1."""
    crlf = buffer.find(b"\n\r\n", start)
    lf = buffer.find(b"\n\n", start)
    if crlf < 0:
        return lf + 2 if lf >= 0 else -1
    if 0 <= lf < crlf:
        return lf + 2
    return crlf + 3


def body_of(spans: list[Span], data: bytes) -> bytes:
    """The data of `spans` of `data`, joined."""
    if len(spans) == 1:
        start, end = spans[0]
        return data if start == 0 and end == len(data) else data[start:end]
    return b"".join([data[start:end] for start, end in spans])
