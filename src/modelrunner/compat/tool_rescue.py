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
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

import jsonschema
import referencing.exceptions

from modelrunner.compat.assemble import CHAT, MESSAGES

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
MARKERS = (CALL_OPEN, FUNCTION_OPEN)
HEADER = b"x-modelrunner-tool-rescue"

Tools = dict[str, dict[str, Any]]  # declared name -> its JSON Schema

_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>]+)>(.*?)</parameter>", re.S)


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
    stripped = text.strip()
    if stripped.startswith("{"):
        call = _json_call(stripped, tools)
        return Rescued("", [call]) if call is not None else None
    start = _first_marker(text)
    if start < 0:
        return None
    calls: list[Call] = []
    rest = text[start:]
    while rest:
        block, rest, _ = _next_block(rest)
        call = _block_call(block, tools) if block is not None else None
        if call is None:
            return None
        calls.append(call)
        rest = rest.lstrip()
    return Rescued(text[:start].strip(), calls)


def new_call_id(prefix: str) -> str:
    """An id for a rescued call, as the APIs spell theirs (`call_...`, `toolu_...`)."""
    return prefix + secrets.token_hex(12)


def _first_marker(text: str) -> int:
    found = [i for i in (text.find(marker) for marker in MARKERS) if i >= 0]
    return min(found) if found else -1


def _next_block(text: str) -> tuple[str | None, str, bool]:
    """The block `text` opens with (None when it opens with no marker), what follows it, and whether
    the block was closed (an engine that stops at its end-of-turn may leave the last one open)."""
    for opener, closer in ((CALL_OPEN, CALL_CLOSE), (FUNCTION_OPEN, FUNCTION_CLOSE)):
        if text.startswith(opener):
            end = text.find(closer)
            if end < 0:
                return text, "", False
            end += len(closer)
            return text[:end], text[end:], True
    return None, text, True


def _block_call(block: str, tools: Tools) -> Call | None:
    if block.startswith(CALL_OPEN):
        inner = block[len(CALL_OPEN) :]
        inner = inner[: -len(CALL_CLOSE)] if inner.endswith(CALL_CLOSE) else inner
        inner = inner.strip()
        return _function_call(inner, tools) if inner.startswith(FUNCTION_OPEN) else _json_call(inner, tools)
    return _function_call(block, tools)


def _json_call(text: str, tools: Tools) -> Call | None:
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
    return _valid(doc.get("name"), arguments, tools)


def _function_call(text: str, tools: Tools) -> Call | None:
    """Qwen3-coder's `<function=NAME>` block; a parameter is a string unless its schema says otherwise."""
    match = _FUNCTION.fullmatch(text.strip())
    if match is None or match.group(1) not in tools:
        return None
    name, body = match.group(1), match.group(2)
    properties = tools[name].get("properties")
    properties = properties if isinstance(properties, dict) else {}
    arguments: dict[str, Any] = {}
    position = 0
    for parameter in _PARAMETER.finditer(body):
        if body[position : parameter.start()].strip():
            return None  # something between parameters: not the shape
        position = parameter.end()
        key, raw = parameter.group(1).strip(), parameter.group(2)
        raw = raw[1:] if raw.startswith("\n") else raw
        raw = raw[:-1] if raw.endswith("\n") else raw
        arguments[key] = _parameter_value(raw, properties.get(key))
    if body[position:].strip():
        return None
    return _valid(name, arguments, tools)


def _parameter_value(raw: str, schema: object) -> Any:
    kinds = schema.get("type") if isinstance(schema, dict) else None
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or "string" in kinds:
        return raw
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw  # the schema's check refuses it


def _valid(name: object, arguments: object, tools: Tools) -> Call | None:
    if not isinstance(name, str) or name not in tools or not isinstance(arguments, dict):
        return None
    schema = tools[name]
    try:
        validator = jsonschema.validators.validator_for(schema)
        validator.check_schema(schema)
        if not validator(schema).is_valid(arguments):
            return None
    except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable):
        return None
    return Call(name, arguments)


def _may_become_calls(tail: str, tools: Tools) -> bool:
    """Whether `tail` (from the first marker on) may still end as calls when more text comes."""
    rest = tail
    while rest:
        if not rest.startswith(MARKERS):
            return any(marker.startswith(rest) for marker in MARKERS)
        block, rest, closed = _next_block(rest)
        if not closed:
            return True
        if block is None or _block_call(block, tools) is None:
            return False
        rest = rest.lstrip()
    return True


class Holdback:
    """A streamed answer's text, less what may still become a call: `feed` each text delta and send
    what it returns; `end` says, once the stream ended, the calls (with the text to send before them)
    or the held text to send as it was."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.held = ""
        self.released = False  # some text went out: a bare JSON call can no longer be the whole answer
        self.passing = False  # known not to be calls: everything goes out as it comes

    def feed(self, delta: str) -> str:
        if self.passing:
            return delta
        self.held += delta
        cut = self._hold_from()
        out, self.held = self.held[:cut], self.held[cut:]
        self.released = self.released or bool(out)
        return out

    def _hold_from(self) -> int:
        text = self.held
        if not self.released and text.lstrip()[:1] in ("", "{") and self._json_may_be_call(text):
            return 0
        start = _first_marker(text)
        if start >= 0:
            if _may_become_calls(text[start:], self.tools):
                return start
            self.passing = True
            return len(text)
        for size in range(min(len(text), max(map(len, MARKERS)) - 1), 0, -1):
            if any(marker.startswith(text[-size:]) for marker in MARKERS):
                return len(text) - size
        return len(text)

    def _json_may_be_call(self, text: str) -> bool:
        """Text that opens with `{` holds until it is a whole JSON value followed by something else."""
        stripped = text.strip()
        if not stripped:
            return True
        try:
            _, end = json.JSONDecoder().raw_decode(stripped)
        except (ValueError, RecursionError):
            return True  # incomplete so far
        return not stripped[end:].strip()

    def end(self) -> tuple[str, Rescued | None]:
        """What is still held, and the calls it is (None: send it as text)."""
        held, self.held = self.held, ""
        if self.passing or not held:
            return held, None
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
