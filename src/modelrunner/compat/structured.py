"""Structured output: the JSON an OpenAI chat or completions request asks for (`response_format`, which
the Ollama `format` and Responses `text.format` translations produce too), given to the engine's grammar
and checked on the answer.

llama-server and vLLM build a grammar from `response_format` on chat completions; llama-server's
`/v1/completions` parses only its own `json_schema` field (tools/server/server-common.cpp handles
`response_format` for chat), so that field is added there. Whatever the engine did, the final text is
validated with jsonschema: an answer that does not validate is an error, never passed on as if it did.
An answer cut by its token limit (`finish_reason: "length"`) is not checked: it is passed on as it is, as
OpenAI does, for the client to see the length it reached (the OpenAI SDKs' `LengthFinishReasonError`;
a 5xx would be retried, three full-length requests for one). `X-Modelrunner-Constraint` says `enforced`
(the engine was given the grammar) or `validated` (only checked after); a whole answer that was cut says
`unvalidated`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jsonschema import exceptions, validators

from modelrunner.compat.assemble import CHAT, COMPLETIONS
from modelrunner.errors import BadRequest, ModelRunnerError
from modelrunner.wire import event_document, first_event_end, sse_events

HEADER = b"x-modelrunner-constraint"
UNVALIDATED = (HEADER, b"unvalidated")  # a whole answer cut by its token limit: passed on unchecked
CUT = "length"  # the finish reason of an answer cut by its token limit
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # `json_object`: llama-server's grammar for it


class ConstraintFailed(ModelRunnerError):
    """The engine's answer is not the JSON the request asked for: a bad answer from upstream."""

    status_code = 502


def requested_schema(path: str, doc: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema a request's answer must satisfy (`response_format`, or llama-server's own
    `json_schema` field), None when it asks for none; a BadRequest when what it asks for is not one."""
    if path not in (CHAT, COMPLETIONS):
        return None
    fmt = doc.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise BadRequest("response_format: must be an object with a type")
        kind = fmt.get("type")
        if kind == "json_object":
            return _checked(fmt.get("schema", ANY_OBJECT))
        if kind == "json_schema":
            wrapper = fmt.get("json_schema")
            if not isinstance(wrapper, dict) or "schema" not in wrapper:
                raise BadRequest("structured output: the JSON schema to follow is missing")
            return _checked(wrapper["schema"])
        return None  # "text", or a type the engine refuses in its own words
    if doc.get("json_schema") is not None:
        return _checked(doc["json_schema"])
    return None


def _checked(schema: object) -> dict[str, Any]:
    """The requested schema, if it is one (the engine would build no grammar, or a wrong one, from it)."""
    if not isinstance(schema, dict):
        raise BadRequest("structured output: the schema must be a JSON Schema object")
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        raise BadRequest(f"structured output: not a valid JSON Schema: {exc.message}") from None
    return schema


def constrained(body: bytes) -> bool:
    """Whether an OpenAI request body asks for structured output (or asks wrongly): such requests are
    served where their answer can be checked, not relayed byte for byte."""
    if b"response_format" not in body and b"json_schema" not in body:
        return False
    try:
        doc = json.loads(body)
        return isinstance(doc, dict) and requested_schema(CHAT, doc) is not None
    except BadRequest:
        return True
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False


@dataclass(frozen=True)
class Constraint:
    """A request's schema, and whether the engine that answers it was given its grammar."""

    schema: dict[str, Any]
    enforced: bool

    @property
    def header(self) -> tuple[bytes, bytes]:
        return HEADER, b"enforced" if self.enforced else b"validated"

    def engine_request(self, json_schema_field: bool, path: str, doc: dict[str, Any]) -> dict[str, Any]:
        """The request as the engine takes the grammar: one whose completions read only `json_schema`
        (`json_schema_field`: llama-server's) gets it there."""
        if json_schema_field and path == COMPLETIONS and "json_schema" not in doc and "grammar" not in doc:
            return {**doc, "json_schema": self.schema}
        return doc

    def check_answer(self, doc: dict[str, Any]) -> bool:
        """An unstreamed chat or completions answer: each choice's text must validate, unless it was cut by
        its token limit; whether every choice was checked."""
        checked = True
        for choice in doc.get("choices") or []:
            message = choice.get("message") or {}
            if message.get("tool_calls"):
                continue  # the model called a tool: there is no JSON answer to check
            text = message.get("content") if "message" in choice else choice.get("text")
            checked &= self.check_text(text if isinstance(text, str) else "", choice.get("finish_reason"))
        return checked

    def check_text(self, text: str, finish: str | None) -> bool:
        """Whether the text was checked (a ConstraintFailed if it does not validate); an answer cut by its
        token limit is not: incomplete JSON is what such an answer is."""
        if finish == CUT:
            return False
        try:
            value = json.loads(text)
        except ValueError:
            raise ConstraintFailed(f"the model's answer is not JSON: {text[:80]!r}") from None
        error = exceptions.best_match(validators.validator_for(self.schema)(self.schema).iter_errors(value))
        if error is not None:
            raise ConstraintFailed(
                f"the model's answer does not match the requested JSON schema: {error.message} "
                f"(at {error.json_path})"
            )
        return True


@dataclass
class StreamText:
    """The text of a chat or completions stream, from its parsed events, to check once it ends."""

    constraint: Constraint
    parts: dict[int, list[str]] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    calls: set[int] = field(default_factory=set)

    def add(self, doc: dict[str, Any]) -> None:
        for choice in doc.get("choices") or []:
            index = int(choice.get("index") or 0)
            delta = choice.get("delta") or {}
            if delta.get("tool_calls"):
                self.calls.add(index)
            text = delta.get("content") if "delta" in choice else choice.get("text")
            if isinstance(text, str):
                self.parts.setdefault(index, []).append(text)
            if choice.get("finish_reason"):
                self.finish[index] = choice["finish_reason"]

    def check(self) -> None:
        for index in sorted(self.parts.keys() | self.finish.keys() or {0}):
            if index not in self.calls:
                self.constraint.check_text("".join(self.parts.get(index, [])), self.finish.get(index))


class StreamCheck:
    """An OpenAI stream's bytes passed on whole events at a time, their text collected; the `[DONE]` that
    would end the stream is held until `end()` has checked the text (a ConstraintFailed ends it instead)."""

    def __init__(self, constraint: Constraint) -> None:
        self.text = StreamText(constraint)
        self.pending = b""
        self.done = b""

    def feed(self, chunk: bytes) -> bytes:
        self.pending += chunk
        out = bytearray()
        while end := first_event_end(self.pending):
            event, self.pending = self.pending[:end], self.pending[end:]
            for _, payload in sse_events(event):
                if payload == b"[DONE]":
                    self.done = event
                    break
                if (doc := event_document(payload)) is not None:
                    self.text.add(doc)
            else:
                out += event
        return bytes(out)

    def end(self) -> bytes:
        self.text.check()
        return self.pending + self.done
