"""The `signature` of every thinking block the daemon answers on Anthropic's Messages API.

Anthropic's clients need a thinking block's signature: the SDK's stream accumulates it from a
`signature_delta`, Claude Code sends the block back on later turns, and Anthropic-shaped clients may drop
or refuse a block whose signature is empty. A local model has no signing key, so the signature is an
opaque digest of the block's whole thinking, the same on every route: a message translated from a chat
completion (compat/anthropic_chat.py) and one the engine's own `/v1/messages` answers.

llama-server b11434 signs with an empty string (tools/server/server-task.cpp): unstreamed, its thinking
block is `{"type": "thinking", "thinking": ..., "signature": ""}` (`to_json_anthropic`); streamed, its
`content_block_start` has no signature, and the final result sends `signature_delta` "" and the thinking
block's `content_block_stop` at the message's end, after the text's and calls' deltas
(`to_json_anthropic_stream`). So an unstreamed body gets its blocks signed (`signed_body`), and a stream
(`SignedStream`) has the engine's signature deltas of a thinking block dropped and ours sent right before
the block stops (one is added where the engine sends none). vLLM 0.32's own Messages
(entrypoints/anthropic/serving.py) signs with a random uuid, which is replaced the same way: a block's
signature is the digest of its thinking on every engine and route.

Most streams have no thinking: `SignedStream` passes their chunks on untouched, looking only for the
bytes `"thinking"` (a thinking block's start has them; inside a JSON string its quotes would be escaped),
and parses events only from the event that holds them until the thinking blocks have stopped (comment
lines are not passed on while it parses: the daemon sends its own pings, server/keepalive.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from modelrunner.compat.anthropic import event
from modelrunner.wire import SSEDecoder, ends_event, last_event_end, sse_event

_MARK = b'"thinking"'
_HELD_MAX = 64  # chunks kept since the last event end before they are cut to the unfinished event


def signature(thinking: str) -> str:
    """The opaque signature of a thinking block with this whole text (the module says why)."""
    return base64.b64encode(hashlib.sha256(b"modelrunner thinking\0" + thinking.encode()).digest()).decode()


def signature_delta(index: int, thinking: str) -> dict[str, Any]:
    """The event that gives the thinking block at `index` its signature, right before its stop."""
    delta = {"type": "signature_delta", "signature": signature(thinking)}
    return {"type": "content_block_delta", "index": index, "delta": delta}


def sign_message(message: dict[str, Any]) -> None:
    """Sign the thinking blocks of a whole message."""
    for block in message.get("content") or []:
        if isinstance(block, dict) and block.get("type") == "thinking":
            block["signature"] = signature(str(block.get("thinking") or ""))


def signed_body(body: bytes) -> bytes:
    """An unstreamed message's JSON body with its thinking blocks signed; any other body as it is."""
    if _MARK not in body:
        return body
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return body
    if not isinstance(message, dict):
        return body
    sign_message(message)
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


class StreamSigner:
    """The thinking blocks of a Messages stream, event by event: `feed(doc)` says what goes out instead
    of the event, None when it goes out as it is."""

    def __init__(self) -> None:
        self.open: dict[int, list[str]] = {}  # the thinking so far of each thinking block not stopped

    def feed(self, doc: dict[str, Any]) -> list[dict[str, Any]] | None:
        kind, index = doc.get("type"), doc.get("index")
        if not isinstance(index, int):
            return None
        if kind == "content_block_start":
            block = doc.get("content_block")
            if isinstance(block, dict) and block.get("type") == "thinking":
                self.open[index] = [str(block.get("thinking") or "")]
            return None
        texts = self.open.get(index)
        if texts is None:
            return None
        if kind == "content_block_delta":
            delta = doc.get("delta")
            delta_type = delta.get("type") if isinstance(delta, dict) else None
            if delta_type == "signature_delta":
                return []  # the engine's (empty) one: ours goes before the stop
            if delta_type == "thinking_delta" and isinstance(delta, dict):
                texts.append(str(delta.get("thinking") or ""))
        elif kind == "content_block_stop":
            del self.open[index]
            return [signature_delta(index, "".join(texts)), doc]
        return None


class SignedStream:
    """An engine's Messages stream (its bytes, as read) with its thinking blocks signed: `feed(chunk)` is
    what goes out for those bytes, `end()` what the stream's end completes."""

    def __init__(self) -> None:
        self.signer = StreamSigner()
        self.decoder: SSEDecoder | None = None  # set while events are parsed
        self.held: list[bytes] = []  # chunks passed on since the last one that ended an event
        self.tail = b""  # their last bytes, for a mark split between chunks
        self.passing = False  # the rest of an event begun before the parsing goes out as it comes

    def feed(self, chunk: bytes) -> bytes:
        if self.decoder is None and not self.held and _MARK not in chunk and ends_event(chunk):
            return chunk  # the common case: whole events, no thinking
        if self.decoder is not None:
            return self._parsed(chunk)
        if _MARK in chunk or (self.held and _MARK in self.tail + chunk[: len(_MARK) - 1]):
            return self._start(chunk)
        if ends_event(chunk) or (self.held and ends_event(self.tail + chunk)):
            if self.held:
                self.held, self.tail = [], b""
        elif chunk:
            self._hold(chunk)
        return chunk

    def end(self) -> bytes:
        return self._write(self.decoder.end()) if self.decoder is not None else b""

    def _hold(self, chunk: bytes) -> None:
        self.held.append(chunk)
        self.tail = (self.tail + chunk)[-len(_MARK) :]
        if len(self.held) >= _HELD_MAX:  # a stream whose reads never end an event: keep only its last one
            joined = b"".join(self.held)
            self.held = [joined[last_event_end(joined) :]]

    def _start(self, chunk: bytes) -> bytes:
        """Parse from the event that holds the mark. Of an event already begun (`held`), what was passed
        on is read for the block's thinking, and its rest goes out as it comes (`passing`): it is the
        block's start or one of its thinking deltas, which are not changed."""
        self.decoder = SSEDecoder()
        sent = b"".join(self.held)
        self.held, self.tail = [], b""
        self._write(self.decoder.feed(sent))
        self.passing = not self.decoder.between_events
        return self._parsed(chunk)

    def _parsed(self, chunk: bytes) -> bytes:
        assert self.decoder is not None
        passed = []
        while self.passing and chunk:  # line by line, to the blank line that ends the event
            line, newline, chunk = chunk.partition(b"\n")
            passed.append(line + newline)
            self._write(self.decoder.feed(line + newline))
            self.passing = not self.decoder.between_events
        out = b"".join(passed) + self._write(self.decoder.feed(chunk))
        if not self.signer.open and self.decoder.between_events:
            self.decoder = None  # every thinking block stopped: back to passing chunks on
        return out

    def _write(self, events: list[tuple[str | None, bytes]]) -> bytes:
        out = []
        for name, data in events:
            try:
                doc = json.loads(data)
            except (ValueError, UnicodeDecodeError, RecursionError):
                doc = None
            instead = self.signer.feed(doc) if isinstance(doc, dict) else None
            if instead is None:
                out.append(sse_event(name, data))
            else:
                out.extend(event(d) for d in instead)
        return b"".join(out)
