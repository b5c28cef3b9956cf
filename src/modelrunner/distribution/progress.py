"""Progress events of pulls and pushes in DMR's newline-delimited JSON shape (contract 2.3).

A `ProgressReporter` turns byte counts from many layer threads into events, throttled like DMR's: one per
layer every 100 ms or 1 MiB, always one when a layer completes. As in DMR, the events cover the manifest's
layers only (`add_layer`): the config blob moves silently, and `total` is the layers' sum from the first
event.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

Mode = Literal["pull", "push"]
Event = dict[str, Any]
Sink = Callable[[Event], None]

THROTTLE_SECONDS = 0.1
THROTTLE_BYTES = 1024 * 1024


def layer_megabytes(n_bytes: int) -> str:
    """DMR's PullMsg/PushMsg figure: the layer's bytes in MiB, two places, labelled `MB`."""
    return f"{n_bytes / 1024 / 1024:.2f} MB"


def event(kind: str, message: str, mode: Mode, total: int = 0, layer: dict[str, Any] | None = None) -> Event:
    return {
        "type": kind,
        "message": message,
        "total": total,
        "layer": layer or {"size": 0, "current": 0},
        "mode": mode,
    }


def encode_line(item: Event, html_escape: bool) -> bytes:
    """One line of the stream. For text/plain, DMR HTML-escapes the JSON (its CLI unescapes it)."""
    text = json.dumps(item, separators=(",", ":"))
    if html_escape:
        text = go_html_escape(text)
    return (text + "\n").encode()


_GO_HTML_ESCAPES = {"&": "&amp;", "'": "&#39;", "<": "&lt;", ">": "&gt;", '"': "&#34;"}


def go_html_escape(text: str) -> str:
    """Go's html.EscapeString, so that DMR's own CLI can read our text/plain streams."""
    return "".join(_GO_HTML_ESCAPES.get(char, char) for char in text)


class ProgressReporter:
    """Thread-safe: layer workers call `advance`; events go to `sink` (the job's broadcaster)."""

    def __init__(self, sink: Sink, mode: Mode, total: int = 0) -> None:
        self._sink = sink
        self._mode = mode
        self._lock = threading.Lock()
        self.total = total
        self._current: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        self._last_sent: dict[str, tuple[float, int]] = {}
        self.transferred = 0  # bytes that crossed the network, for "nothing transferred" checks

    def status(self, message: str) -> None:
        self._sink(event("progress", message, self._mode, self.total))

    def warning(self, message: str) -> None:
        self._sink(event("warning", message, self._mode, self.total))

    def add_layer(self, layer_id: str, size: int, already: int = 0) -> None:
        with self._lock:
            self._sizes[layer_id] = size
            self._current[layer_id] = already

    def set_layer(self, layer_id: str, current: int) -> None:
        """A restart (the server ignored Range) or a resume: the layer's count jumps."""
        with self._lock:
            if layer_id not in self._sizes:
                return
            self._current[layer_id] = current
        self._emit(layer_id, force=True)

    def advance(self, layer_id: str, n_bytes: int) -> None:
        with self._lock:
            self.transferred += n_bytes
            if layer_id not in self._sizes:
                return
            self._current[layer_id] += n_bytes
        self._emit(layer_id, force=False)

    def layer_done(self, layer_id: str) -> None:
        with self._lock:
            if layer_id not in self._sizes:
                return
            self._current[layer_id] = self._sizes[layer_id]
        self._emit(layer_id, force=True)

    def _emit(self, layer_id: str, force: bool) -> None:
        with self._lock:
            current = self._current[layer_id]
            size = self._sizes.get(layer_id, 0)
            now = time.monotonic()
            last_time, last_bytes = self._last_sent.get(layer_id, (0.0, -1))
            due = now - last_time >= THROTTLE_SECONDS or current - last_bytes >= THROTTLE_BYTES
            if not force and (not due or current == last_bytes):
                return
            self._last_sent[layer_id] = (now, current)
        verb = "Downloaded" if self._mode == "pull" else "Uploaded"
        layer = {"id": layer_id, "size": size, "current": current}
        self._sink(event("progress", f"{verb}: {layer_megabytes(current)}", self._mode, self.total, layer))

    def success(self, message: str) -> None:
        self._sink(event("success", message, self._mode))
