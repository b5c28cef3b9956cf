"""What every side reads off the wire the same way: server-sent events and the message of an error body.

The daemon (engine streams, the recorder), compat/ and the CLI all use these, so this module imports
nothing but the standard library's json: the CLI loads it on every command.
"""

from __future__ import annotations

import json
from typing import Any

REQUEST_ID_HEADER = b"x-request-id"  # the daemon's id of a request, on every answer (eventlog.py)
TEXT_KEPT = 500  # characters of a body that is not JSON kept as its error message


# -- server-sent events --------------------------------------------------------------------------------


def sse_field(line: bytes) -> tuple[bytes, bytes]:
    """(name, value) of one event-stream line, without its line end: `data: x` -> (b"data", b"x"); one
    space after the colon belongs to the syntax, not to the value."""
    name, _, value = line.removesuffix(b"\r").partition(b":")
    return name, value[1:] if value.startswith(b" ") else value


def sse_event(name: str | None, data: bytes) -> bytes:
    """One event as it goes on the wire: its name (if any), each line of `data` as a `data:` line, the
    blank line that ends it."""
    head = b"event: %s\n" % name.encode() if name is not None else b""
    return head + b"data: " + data.replace(b"\n", b"\ndata: ") + EVENT_END


# -- where an event ends: the one rule of every part that pings, cuts or rewrites a stream ---------------
# (the C relay keeps a stream's TAIL in C: tests/unit/test_native_relay.py holds it to ResponseReader's)

EVENT_END = b"\n\n"  # the blank line after an event, as the daemon (and every engine) writes it
EVENT_ENDS = (b"\n\n", b"\n\r\n")  # as SSEDecoder reads lines: a line empty but for its CR
TAIL = 2  # the last bytes of a stream a relay keeps to know whether it ended an event


def ends_event(data: bytes) -> bool:
    """Whether bytes (a whole chunk, or a stream's last TAIL bytes) end where an event ended. Two bytes see
    LF LF only: a stream whose events end with CRLF is taken as cut there, which costs a blank line (which
    readers skip) or a ping held back, never an event broken in two."""
    return data.endswith(EVENT_ENDS)


def first_event_end(data: bytes) -> int:
    """Where the first event that ends in `data` ends (after its blank line); 0 where none does."""
    ends = [at + len(end) for end in EVENT_ENDS if (at := data.find(end)) >= 0]
    return min(ends, default=0)


def last_event_end(data: bytes) -> int:
    """Where the last event that ends in `data` ends (after its blank line); 0 where none does."""
    return max((at + len(end) for end in EVENT_ENDS if (at := data.rfind(end)) >= 0), default=0)


def tail_after(tail: bytes, data: bytes) -> bytes:
    """A stream's last TAIL bytes once `data` followed those ending with `tail` (EVENT_END before any)."""
    return data[-TAIL:] if len(data) >= TAIL else (tail + data)[-TAIL:]


def event_closed(tail: bytes) -> bytes:
    """What goes before an event the daemon adds to a stream whose last bytes are `tail`: nothing where an
    event ended, else the blank line that ends the event it cut."""
    return b"" if ends_event(tail) else EVENT_END


class SSEDecoder:
    """`feed(bytes)` returns the events completed by those bytes: (event name or None, data), the data
    lines of one event joined by newlines; `end()` those the stream's end completes. Comment lines (`:`
    pings) are skipped."""

    def __init__(self) -> None:  # not a dataclass: dataclasses imports inspect, a cost on every command
        self._pending = b""
        self._event: str | None = None
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        if b"\n" not in chunk:
            self._pending += chunk
            return []
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        events: list[tuple[str | None, bytes]] = []
        for line in lines:
            if not line.removesuffix(b"\r"):
                if self._data or self._event is not None:
                    events.append((self._event, b"\n".join(self._data)))
                self._event, self._data = None, []
                continue
            name, value = sse_field(line)
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
        return events

    @property
    def between_events(self) -> bool:
        """Nothing of an unfinished event held: what is fed next starts a new one."""
        return not self._pending and not self._data and self._event is None

    def end(self) -> list[tuple[str | None, bytes]]:
        """The events a stream that stops here still completes (its last line, its last event)."""
        return self.feed(b"\n\n")


def event_document(payload: bytes) -> dict[str, Any] | None:
    """An event's data as the JSON object it carries; None for anything else (`[DONE]`, a broken line)."""
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def sse_events(body: bytes) -> list[tuple[str | None, bytes]]:
    """Every event of a whole stream."""
    decoder = SSEDecoder()
    return decoder.feed(body) + decoder.end()


# -- error bodies ----------------------------------------------------------------------------------------


def document_message(doc: Any) -> str | None:
    """The message of a decoded error: OpenAI's and Anthropic's `{"error": {"message"}}`, Ollama's
    `{"error": "..."}`, DMR's and llama-server's `{"message": ...}`; None when it says none."""
    if not isinstance(doc, dict):
        return None
    error = doc.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        return str(error["message"])
    if isinstance(error, str) and error:
        return error
    message = doc.get("message")
    return message if isinstance(message, str) and message else None


def error_message(body: bytes) -> str | None:
    """The message of an error body, whatever its shape (JSON as `document_message` reads it, else its
    text, cut short); None for an empty body."""
    try:
        message = document_message(json.loads(body))
    except (ValueError, UnicodeDecodeError, RecursionError):
        message = None
    if message is not None:
        return message
    return body.decode("utf-8", "replace").strip()[:TEXT_KEPT] or None
