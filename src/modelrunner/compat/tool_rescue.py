"""Tool calls an engine wrote as text, given back as calls (issue 22 item 4).

When a chat template or an engine's parser misses a call, the model's call arrives as the answer's text, in
one of the shapes seen in the wild (ollama#16686, #18530, vllm#22975):

* Hermes/Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call;
* Qwen3-coder: `<function=NAME><parameter=P>value</parameter>...</function>`, with or without a
  `<tool_call>` around it;
* bare Hermes JSON: the whole answer is `{"name": ..., "arguments"|"parameters": {...}}`.

A text is rescued only when everything from the first call marker on is calls (whitespace between them),
each naming a tool the request declared, with arguments that validate against that tool's JSON Schema;
the text before the first marker stays the answer's text. Anything else is left alone: a rescue never
guesses. `Holdback` is the same rule for a stream: it holds back only text that may still become a call.

Reading is linear in the text, whatever it holds (issue 36 item 1: a backtracking expression took ~50 s over
10,000 unclosed `<parameter=a>`): one scan with `str.find`, each block read once when its closer comes (a
stream's too, as it comes), and bounded: a text over MAX_CHARS, or one whose reading outlasts MAX_SECONDS,
is left as the text it is, with a log line saying why.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import jsonschema
import referencing.exceptions

from modelrunner.compat.assemble import CHAT, MESSAGES
from modelrunner.eventlog import event

log = logging.getLogger(__name__)

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
MARKERS = (CALL_OPEN, FUNCTION_OPEN)
BLOCKS = ((CALL_OPEN, CALL_CLOSE), (FUNCTION_OPEN, FUNCTION_CLOSE))  # a marker's block ends at its closer
HEADER = b"x-modelrunner-tool-rescue"
MAX_CHARS = 2 * 1024 * 1024  # a longer answer is no call anyone meant: left as text, unread
MAX_SECONDS = 5.0  # a backstop: reading is linear (a 1 MB answer takes well under a second)

Tools = dict[str, dict[str, Any]]  # declared name -> its JSON Schema

# Single-character classes, anchored or searched: neither can backtrack (each character is looked at once).
_SPACES = re.compile(r"\s*")  # `\s` is str.isspace(), the whitespace str.strip() takes off
_JSON_STRUCTURE = re.compile(r'[{}\[\]"]')
_JSON_STRING_END = re.compile(r'["\\]')


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Rescued:
    text: str  # what came before the calls
    calls: list[Call]


def declared(path: str, doc: dict[str, Any]) -> Tools | None:
    """The tools a chat or Messages request declares (OpenAI `function` tools, Anthropic custom tools
    with an `input_schema`), unless its `tool_choice` says none may be called."""
    if path not in (CHAT, MESSAGES):
        return None
    tools = doc.get("tools")
    choice = doc.get("tool_choice")
    if not isinstance(tools, list) or choice == "none":
        return None
    if isinstance(choice, dict) and choice.get("type") == "none":
        return None
    out: Tools = {}
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict):
            name, schema = function.get("name"), function.get("parameters", {})
        elif "input_schema" in tool:
            name, schema = tool.get("name"), tool["input_schema"]
        else:
            continue  # a server tool (Anthropic's web search ...): not the client's to call
        if isinstance(name, str) and name:
            out[name] = schema if isinstance(schema, dict) else {}
    return out or None


def rescue(text: str, tools: Tools) -> Rescued | None:
    """The calls `text` is, with the text before them; None when it is not only valid calls."""
    if len(text) > MAX_CHARS:
        _left_as_text("too_long", len(text))
        return None
    stripped = text.strip()
    if stripped.startswith("{"):
        call = _json_call(stripped, _Schemas(tools))
        return Rescued("", [call]) if call is not None else None
    start = _first_marker(text)
    if start < 0:
        return None
    scan = _CallScan(tools, deadline=time.monotonic() + MAX_SECONDS)
    scan.feed(text, start)
    calls = scan.finish()
    if scan.timed_out:
        _left_as_text("too_slow", len(text))
    return Rescued(text[:start].strip(), calls) if calls is not None else None


def new_call_id(prefix: str) -> str:
    """An id for a rescued call, as the APIs spell theirs (`call_...`, `toolu_...`)."""
    return prefix + secrets.token_hex(12)


def _left_as_text(reason: str, chars: int) -> None:
    event(log, "tool_rescue_skipped", logging.WARNING, reason=reason, chars=chars)


def _first_marker(text: str) -> int:
    found = [i for i in (text.find(marker) for marker in MARKERS) if i >= 0]
    return min(found) if found else -1


def _skip_spaces(text: str, position: int) -> int:
    match = _SPACES.match(text, position)
    assert match is not None  # `\s*` matches everywhere
    return match.end()


class _CallScan:
    """Text from a call marker on, read as it comes (`feed`, once or piece by piece): whitespace, then blocks,
    each from its marker to its closer. A block is read once, when its closer comes; what is held meanwhile is
    the open block's pieces and the last few characters a closer cut in two may start with. `failed`: the text
    can no longer be only calls; `finish` says, at its end, the calls it is (an engine that stops at its
    end-of-turn may leave the last block open) or None."""

    def __init__(self, tools: Tools, deadline: float | None = None) -> None:
        self.schemas = _Schemas(tools)
        self.deadline = deadline
        self.calls: list[Call] = []
        self.failed = False
        self.timed_out = False
        self._lead = ""  # between blocks: the start of a marker, cut by the end of a piece
        self._closer: str | None = None  # the open block's closer (None: between blocks)
        self._block: list[str] = []  # the open block's text so far
        self._tail = ""  # its last characters, fewer than a closer's

    def feed(self, text: str, position: int = 0) -> bool:
        """Reads `text` from `position` on; whether what was read may still be only calls."""
        while position < len(text) and not self.failed:
            between = self._closer is None
            position = self._between(text, position) if between else self._inside(text, position)
        return not self.failed

    def finish(self) -> list[Call] | None:
        if self.failed or self._lead:
            return None
        if self._closer is not None:
            self._closed("".join(self._block))
        return None if self.failed else self.calls

    def _between(self, text: str, position: int) -> int:
        if not self._lead:
            position = _skip_spaces(text, position)
        carried = len(self._lead)  # of the marker, in the pieces before this one
        lead = self._lead + text[position : position + max(map(len, MARKERS)) - carried]
        for opener, closer in BLOCKS:
            if lead.startswith(opener):
                self._lead, self._closer, self._block = "", closer, [opener]
                return position + len(opener) - carried
        if lead and any(marker.startswith(lead) for marker in MARKERS):
            self._lead = lead  # the piece ended in the middle of a marker
        elif lead:
            self.failed = True  # something that opens no block
        return len(text)

    def _inside(self, text: str, position: int) -> int:
        closer = self._closer
        assert closer is not None
        keep = len(closer) - 1
        across = (self._tail + text[position : position + keep]).find(closer)  # a closer cut in two
        if across >= 0:
            end = position + across + len(closer) - len(self._tail)
        else:
            found = text.find(closer, position)
            end = found + len(closer) if found >= 0 else -1
        if end < 0:
            self._block.append(text[position:])
            self._tail = (self._tail + text[max(position, len(text) - keep) :])[-keep:]
            return len(text)
        self._block.append(text[position:end])
        self._closed("".join(self._block))
        return end

    def _closed(self, block: str) -> None:
        self._closer, self._block, self._tail = None, [], ""
        call = _block_call(block, self.schemas)
        if call is None:
            self.failed = True
        elif self.deadline is not None and time.monotonic() > self.deadline:
            self.failed = self.timed_out = True
        else:
            self.calls.append(call)


def _block_call(block: str, schemas: _Schemas) -> Call | None:
    if block.startswith(CALL_OPEN):
        inner = block[len(CALL_OPEN) :]
        inner = inner[: -len(CALL_CLOSE)] if inner.endswith(CALL_CLOSE) else inner
        inner = inner.strip()
        function = inner.startswith(FUNCTION_OPEN)
        return _function_call(inner, schemas) if function else _json_call(inner, schemas)
    return _function_call(block, schemas)


def _json_call(text: str, schemas: _Schemas) -> Call | None:
    """A Hermes call object: `name`, and `arguments` (or `parameters`) as an object or its JSON text."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or set(doc) - {"name", "arguments", "parameters"}:
        return None
    arguments = doc.get("arguments", doc.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    return schemas.call(doc.get("name"), arguments)


def _function_call(text: str, schemas: _Schemas) -> Call | None:
    """Qwen3-coder's `<function=NAME>` block, the whole of `text`: NAME (no `>`, no whitespace), then
    parameters `<parameter=P>value</parameter>` with only whitespace between them; a parameter is a string
    unless its schema says otherwise."""
    text = text.strip()
    if not text.startswith(FUNCTION_OPEN) or not text.endswith(FUNCTION_CLOSE):
        return None
    name_end = text.find(">", len(FUNCTION_OPEN))
    body_end = len(text) - len(FUNCTION_CLOSE)
    if name_end < 0 or name_end >= body_end:
        return None
    name = text[len(FUNCTION_OPEN) : name_end]
    if not name or any(character.isspace() for character in name) or name not in schemas.tools:
        return None
    properties = schemas.tools[name].get("properties")
    properties = properties if isinstance(properties, dict) else {}
    arguments: dict[str, Any] = {}
    position = _skip_spaces(text, name_end + 1)
    while position < body_end:
        parameter = _parameter(text, position, body_end)
        if parameter is None:
            return None  # something between parameters, or one left open: not the shape
        key, raw, end = parameter
        raw = raw[1:] if raw.startswith("\n") else raw
        raw = raw[:-1] if raw.endswith("\n") else raw
        arguments[key] = _parameter_value(raw, properties.get(key))
        position = _skip_spaces(text, end)
    return schemas.call(name, arguments)


def _parameter(text: str, position: int, end: int) -> tuple[str, str, int] | None:
    """The `<parameter=P>value</parameter>` at `position` (and before `end`): P (stripped), its value, and
    where it ends."""
    if not text.startswith(PARAMETER_OPEN, position, end):
        return None
    key_end = text.find(">", position + len(PARAMETER_OPEN), end)
    if key_end <= position + len(PARAMETER_OPEN):  # none, or an empty name
        return None
    close = text.find(PARAMETER_CLOSE, key_end + 1, end)
    if close < 0:
        return None
    key = text[position + len(PARAMETER_OPEN) : key_end].strip()
    return key, text[key_end + 1 : close], close + len(PARAMETER_CLOSE)


def _parameter_value(raw: str, schema: object) -> Any:
    kinds = schema.get("type") if isinstance(schema, dict) else None
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or "string" in kinds:
        return raw
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw  # the schema's check refuses it


class _Schemas:
    """The declared tools' schemas, each checked and made a validator once, however many calls name it
    (checking a schema costs far more than a call's small arguments)."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self._validators: dict[str, Any] = {}  # name -> its validator, None when its schema is invalid

    def call(self, name: object, arguments: object) -> Call | None:
        """The call, when `name` is declared and `arguments` validate against its schema."""
        if not isinstance(name, str) or name not in self.tools or not isinstance(arguments, dict):
            return None
        if name not in self._validators:
            self._validators[name] = self._validator(self.tools[name])
        validator = self._validators[name]
        try:
            if validator is None or not validator.is_valid(arguments):
                return None
        except referencing.exceptions.Unresolvable:
            return None
        return Call(name, arguments)

    @staticmethod
    def _validator(schema: dict[str, Any]) -> Any:
        try:
            kind = jsonschema.validators.validator_for(schema)
            kind.check_schema(schema)
        except jsonschema.exceptions.SchemaError:
            return None
        return kind(schema)


class _JsonOpening:
    """Whether an answer that opens with `{` may still be a bare JSON call, read as it comes: it may until it
    is a whole JSON value followed by something else. Each character is looked at once: the brackets and
    strings are followed to where the value closes, and the value is decoded once, then."""

    def __init__(self) -> None:
        self.pieces: list[str] = []  # the value so far
        self.state = "space"  # before the value; then "value", "after" (a whole value) or "not" (never one)
        self.depth = 0
        self.in_string = False
        self.escaped = False  # a backslash ended the last piece, in a string

    def may_be_call(self, piece: str) -> bool:
        if self.state == "space":
            start = _skip_spaces(piece, 0)
            if start == len(piece):
                return True
            if piece[start] != "{":
                self.state = "not"
                return False
            self.state, piece = "value", piece[start:]
        if self.state == "value":
            end = self._value_end(piece)
            self.pieces.append(piece if end < 0 else piece[:end])
            if end < 0:
                return True
            self.state = "after" if self._decodes("".join(self.pieces)) else "stuck"
            self.pieces = []
            piece = piece[end:]
        if self.state == "after" and _skip_spaces(piece, 0) < len(piece):
            self.state = "not"
        return self.state != "not"  # "stuck" (not JSON, whatever follows) holds to the end, as ever

    def _value_end(self, piece: str) -> int:
        """Where in `piece` the value's outermost bracket closes (just after it), -1 if it does not."""
        position = 0
        if self.escaped and piece:  # the character a backslash escapes
            self.escaped, position = False, 1
        while position < len(piece):
            if self.in_string:
                match = _JSON_STRING_END.search(piece, position)
                if match is None:
                    return -1
                position = match.end()
                if match.group() == "\\":
                    if position == len(piece):
                        self.escaped = True
                    position += 1
                else:
                    self.in_string = False
                continue
            match = _JSON_STRUCTURE.search(piece, position)
            if match is None:
                return -1
            position, character = match.end(), match.group()
            if character == '"':
                self.in_string = True
            elif character in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    return position
        return -1

    @staticmethod
    def _decodes(value: str) -> bool:
        try:
            _, end = json.JSONDecoder().raw_decode(value)
        except (ValueError, RecursionError):
            return False
        return end == len(value)


class Holdback:
    """A streamed answer's text, less what may still become a call: `feed` each text delta and send
    what it returns; `end` says, once the stream ended, the calls (with the text to send before them)
    or the held text to send as it was. Each delta is read once (`_JsonOpening`, `_CallScan`): the work
    of a whole stream is linear in its text; held text over MAX_CHARS goes out as text."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.released = False  # some text went out: a bare JSON call can no longer be the whole answer
        self.passing = False  # known not to be calls: everything goes out as it comes
        self._held: list[str] = []  # the text held back, in pieces
        self._size = 0
        self._opening: _JsonOpening | None = _JsonOpening()  # until the answer is known not to be bare JSON
        self._calls: _CallScan | None = None  # the held text opens with a marker: its calls, read so far

    def feed(self, delta: str) -> str:
        if self.passing:
            return delta
        self._held.append(delta)
        self._size += len(delta)
        if self._size > MAX_CHARS:
            _left_as_text("too_long", self._size)
            self.passing = True
            return self._release(self._take())
        if self._opening is not None:
            if self._opening.may_be_call(delta):
                return ""
            self._opening = None
        if self._calls is not None:
            if self._calls.feed(delta):
                return ""
            self.passing = True
            return self._release(self._take())
        return self._release(self._hold_from_marker(self._take()))

    def _take(self) -> str:
        held, self._held, self._size = "".join(self._held), [], 0
        return held

    def _release(self, out: str) -> str:
        self.released = self.released or bool(out)
        return out

    def _hold_from_marker(self, text: str) -> str:
        """What of `text` goes out; from its first marker on (or the start of one at its end) it is held."""
        start = _first_marker(text)
        if start >= 0:
            scan = _CallScan(self.tools)
            if not scan.feed(text, start):
                self.passing = True
                return text
            self._calls, cut = scan, start
        else:  # a marker's start can only be from the last `<` on (a marker has no other)
            last = text.rfind("<", max(0, len(text) - max(map(len, MARKERS)) + 1))
            partial = last >= 0 and any(marker.startswith(text[last:]) for marker in MARKERS)
            cut = last if partial else len(text)
        if cut < len(text):
            self._held, self._size = [text[cut:]], len(text) - cut
        return text[:cut]

    def end(self) -> tuple[str, Rescued | None]:
        """What is still held, and the calls it is (None: send it as text)."""
        held = self._take()
        if self.passing or not held:
            return held, None
        if self._calls is not None:  # read as it came: no second reading
            calls = self._calls.finish()
            return (held, None) if calls is None else ("", Rescued("", calls))
        found = rescue(held, self.tools)
        return (held, None) if found is None else (found.text, found)


def rescue_chat(doc: dict[str, Any], tools: Tools) -> int:
    """An OpenAI chat completion whose message text is calls gets them as `tool_calls`; the count."""
    count = 0
    for choice in doc.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict) or message.get("tool_calls"):
            continue
        content = message.get("content")
        found = rescue(content, tools) if isinstance(content, str) else None
        if found is None:
            continue
        message["content"] = found.text or None
        message["tool_calls"] = [
            {
                "id": new_call_id("call_"),
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in found.calls
        ]
        choice["finish_reason"] = "tool_calls"
        count += len(found.calls)
    return count


def rescue_message(doc: dict[str, Any], tools: Tools) -> int:
    """An Anthropic message whose text is calls gets them as `tool_use` blocks; the count."""
    content = doc.get("content")
    if not isinstance(content, list) or any(
        not isinstance(block, dict) or block.get("type") == "tool_use" for block in content
    ):
        return 0
    text = "".join(str(block.get("text") or "") for block in content if block.get("type") == "text")
    found = rescue(text, tools)
    if found is None:
        return 0
    blocks = [block for block in content if block.get("type") != "text"]  # thinking stays first
    if found.text:
        blocks.append({"type": "text", "text": found.text})
    for call in found.calls:
        blocks.append(
            {"type": "tool_use", "id": new_call_id("toolu_"), "name": call.name, "input": call.arguments}
        )
    doc["content"] = blocks
    doc["stop_reason"] = "tool_use"
    return len(found.calls)


class ChatStreamRescue:
    """An OpenAI chat stream's chunks (parsed), with calls written as text sent as `tool_calls` deltas:
    `feed` each chunk and send the chunks it returns. Only the first choice of a one-choice stream is
    rescued; a stream whose engine sends calls of its own passes as it is. `rescued` counts the calls."""

    def __init__(self, tools: Tools) -> None:
        self.holdback = Holdback(tools)
        self.rescued = 0
        self.last: dict[str, Any] = {}  # the last chunk of the choice, the shape of one that ends it

    def end(self) -> list[dict[str, Any]]:
        """A stream that ended without a finish reason: what it held goes out as the text it was."""
        held, _ = self.holdback.end() if not self.holdback.passing else ("", None)
        if not held:
            return []
        choice = {"index": 0, "delta": {"content": held}, "finish_reason": None}
        return [{**self.last, "choices": [choice]}]

    def feed(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        choices = doc.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return [doc]
        choice, self.last = choices[0], doc
        given = choice.get("delta")
        delta: dict[str, Any] = given if isinstance(given, dict) else {}
        if delta.get("tool_calls") or int(choice.get("index") or 0) != 0:
            self.holdback.passing = True  # the engine parsed its calls itself (or this is not one choice)
        content = delta.get("content")
        if isinstance(content, str) and not self.holdback.passing:
            delta = {**delta, "content": self.holdback.feed(content)}
        out = [{**doc, "choices": [{**choice, "delta": delta}]}]
        if not choice.get("finish_reason"):
            return out if delta.get("content") or set(delta) - {"content"} else []
        return self._finish(out[0], choice, delta)

    def _finish(
        self, doc: dict[str, Any], choice: dict[str, Any], delta: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The last chunk of the choice: what was held goes out, as calls or as the text it was."""
        held, found = self.holdback.end()
        self.holdback.passing = True  # the choice is done
        if found is None:
            if not held:
                return [doc]
            return [
                {
                    **doc,
                    "choices": [
                        {**choice, "delta": {**delta, "content": (delta.get("content") or "") + held}}
                    ],
                }
            ]
        calls = [
            {
                "index": i,
                "id": new_call_id("call_"),
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for i, call in enumerate(found.calls)
        ]
        self.rescued += len(calls)
        text = (delta.get("content") or "") + found.text
        rescued_delta = {**delta, "content": text or None, "tool_calls": calls}
        return [{**doc, "choices": [{**choice, "delta": rescued_delta, "finish_reason": "tool_calls"}]}]


class MessageStreamRescue:
    """An Anthropic message stream's events (parsed), with calls written as text sent as `tool_use` blocks
    (`input_json_delta`, then `stop_reason: tool_use`): `feed` each event and send the events it returns.
    The first text block is held back as `Holdback` says (its start too, until it has text to send); the
    engine's later blocks move up by the blocks added. A stream with `tool_use` blocks of the engine's own
    passes as it is. `rescued` counts the calls."""

    def __init__(self, tools: Tools) -> None:
        self.holdback = Holdback(tools)
        self.rescued = 0
        self.index: int | None = None  # the text block held back
        self.start: dict[str, Any] | None = None  # its `content_block_start`, until it is sent
        self.shift = 0
        self.called = False  # calls replaced the held text: the stop reason says so

    def feed(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        kind, index = doc.get("type"), doc.get("index")
        if self.holdback.passing:
            return [self._shifted(doc)]
        if kind == "content_block_start":
            block = doc.get("content_block")
            block_type = block.get("type") if isinstance(block, dict) else None
            if block_type == "text" and self.index is None and isinstance(index, int):
                self.index, self.start = index, doc
                return []
            if block_type == "tool_use":
                self.holdback.passing = True
            return [doc]
        if index == self.index and index is not None:
            delta = doc.get("delta")
            if (
                kind == "content_block_delta"
                and isinstance(delta, dict)
                and delta.get("type") == "text_delta"
            ):
                return self._text(self.holdback.feed(str(delta.get("text") or "")))
            if kind == "content_block_stop":
                return self._close(doc, index)
        return [doc]

    def _shifted(self, doc: dict[str, Any]) -> dict[str, Any]:
        index = doc.get("index")
        if self.shift and self.index is not None and isinstance(index, int) and index > self.index:
            return {**doc, "index": index + self.shift}
        if doc.get("type") == "message_delta" and self.called:
            delta = doc.get("delta")
            return {**doc, "delta": {**(delta if isinstance(delta, dict) else {}), "stop_reason": "tool_use"}}
        return doc

    def _text(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        out = [self.start] if self.start is not None else []
        self.start = None
        delta = {"type": "text_delta", "text": text}
        return [*out, {"type": "content_block_delta", "index": self.index, "delta": delta}]

    def _close(self, stop: dict[str, Any], index: int) -> list[dict[str, Any]]:
        """The held text block ends: what it held goes out as calls, or as its text."""
        held, found = self.holdback.end()
        self.holdback.passing = True  # later blocks are the engine's, as they come
        if found is None:
            out = self._text(held)
            return [*out, *([self.start] if self.start is not None else []), stop]
        out = self._text(found.text)
        if self.start is None:  # the text block was sent: close it; the calls come after it
            out.append(stop)
            index += 1
        for call in found.calls:
            block = {"type": "tool_use", "id": new_call_id("toolu_"), "name": call.name, "input": {}}
            partial = {
                "type": "input_json_delta",
                "partial_json": json.dumps(call.arguments, ensure_ascii=False),
            }
            out += [
                {"type": "content_block_start", "index": index, "content_block": block},
                {"type": "content_block_delta", "index": index, "delta": partial},
                {"type": "content_block_stop", "index": index},
            ]
            index += 1
        assert self.index is not None
        self.shift = index - (self.index + 1)
        self.rescued, self.called = len(found.calls), True
        return out
