"""Server-sent events read from bytes as they arrive (the engines' streams, and our own when recorded)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SSEDecoder:
    """`feed(bytes)` returns the events completed by those bytes: (event name or None, data), the data
    lines of one event joined by newlines. Comment lines (`:` pings) are skipped."""

    _pending: bytes = b""
    _event: str | None = None
    _data: list[bytes] = field(default_factory=list)

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        if b"\n" not in chunk:
            self._pending += chunk
            return []
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        events: list[tuple[str | None, bytes]] = []
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if self._data or self._event is not None:
                    events.append((self._event, b"\n".join(self._data)))
                self._event, self._data = None, []
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
        return events


def sse_events(body: bytes) -> list[tuple[str | None, bytes]]:
    """Every complete event of a whole stream."""
    return SSEDecoder().feed(body + b"\n\n" if not body.endswith(b"\n\n") else body)
