"""OpenAI Responses API shapes, their translation to chat completions, and the store of past responses.

llama-server (b11434) has a stateless `/v1/responses` that refuses `previous_response_id`, and other
engines have none, so responses are translated here to chat completions (as DMR does): that gives
every engine the same API, with stored responses for `GET`, `input_items` and chaining.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from modelrunner.compat.bodies import validated
from modelrunner.errors import BadRequest
from modelrunner.scheduler.memory import env_bytes

MAX_STORED = 1000
MAX_AGE_SECONDS = 3600.0
DEFAULT_STORE_BYTES = 128 * 2**20
# OpenAI's limits of `metadata`: at most 16 pairs, keys up to 64 characters, values strings up to 512
METADATA_PAIRS, METADATA_KEY_LENGTH, METADATA_VALUE_LENGTH = 16, 64, 512

# Parameters we cannot honour: refused rather than silently ignored (the contract's list).
_REJECTED = (
    "include",
    "stream_options",
    "top_logprobs",
    "background",
    "conversation",
    "prompt",
    "service_tier",
    "safety_identifier",
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(max_length=100_000)
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None


def check_metadata(metadata: Any) -> None:
    """OpenAI's limits of `metadata`, with its messages: it is kept with the stored response."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise BadRequest("Invalid 'metadata': expected an object", param="metadata")
    if len(metadata) > METADATA_PAIRS:
        raise BadRequest(
            f"Invalid 'metadata': too many properties. Expected an object with at most {METADATA_PAIRS} "
            f"properties, but got an object with {len(metadata)} properties instead.",
            param="metadata",
        )
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_LENGTH:
            raise BadRequest(
                f"Invalid 'metadata': a key is too long. Expected keys of at most {METADATA_KEY_LENGTH} "
                f"characters, but got a key of {len(key)} characters instead.",
                param="metadata",
            )
        if not isinstance(value, str):
            raise BadRequest(f"Invalid 'metadata.{key}': expected a string", param="metadata")
        if len(value) > METADATA_VALUE_LENGTH:
            raise BadRequest(
                f"Invalid 'metadata.{key}': string too long. Expected a string with maximum length "
                f"{METADATA_VALUE_LENGTH}, but got a string with length {len(value)} instead.",
                param="metadata",
            )


def check_request(doc: dict[str, Any]) -> ResponsesRequest:
    check_metadata(doc.get("metadata"))
    for name in _REJECTED:
        value = doc.get(name)
        if value in (None, [], {}) or (name == "service_tier" and value in ("auto", "default")):
            continue
        if name == "background" and value is False:
            continue
        raise BadRequest(f"the parameter {name!r} is not supported")
    if doc.get("truncation") not in (None, "disabled"):
        raise BadRequest("only truncation 'disabled' is supported")
    checked = validated(ResponsesRequest, doc)
    if not checked.input and not checked.previous_response_id:
        raise BadRequest("input: must not be empty")  # the engine would answer an empty conversation
    return checked


# -- input -------------------------------------------------------------------------------------------


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's input as items with ids, as `input_items` lists them."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    items = []
    for raw in value:
        item = dict(raw)
        kind = item.setdefault("type", "message")
        if kind == "message":
            if not isinstance(item.get("role"), str):
                raise BadRequest("every input message needs a role")
            content = item.get("content")
            if isinstance(content, str):
                part_type = "output_text" if item["role"] == "assistant" else "input_text"
                item["content"] = [{"type": part_type, "text": content}]
            elif not isinstance(content, list):
                raise BadRequest("a message's content must be a string or a list of parts")
            item.setdefault("status", "completed")
            item.setdefault("id", new_id("msg"))
        elif kind in ("function_call", "function_call_output"):
            if not isinstance(item.get("call_id"), str):
                raise BadRequest(f"a {kind} item needs a call_id")
            item.setdefault("id", new_id("fc" if kind == "function_call" else "fco"))
            item.setdefault("status", "completed")
        elif kind == "reasoning":
            item.setdefault("id", new_id("rs"))
        else:
            raise BadRequest(f"input items of type {str(kind)[:40]!r} are not supported")
        items.append(item)
    return items


def _chat_content(parts: list[Any]) -> str | list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, dict):
            raise BadRequest("content parts must be objects")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "refusal"):
            out.append({"type": "text", "text": str(part.get("text") or part.get("refusal") or "")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise BadRequest("input_image needs an image_url (file ids are not supported)")
            out.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise BadRequest(f"content parts of type {str(kind)[:40]!r} are not supported")
    if all(p["type"] == "text" for p in out):
        return "".join(p["text"] for p in out)
    return out


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input or output items as chat messages; an assistant message and the function calls after it
    become one assistant turn, as `output_items` splits one (LangChain sends an empty message before its
    calls: no empty turn of its own)."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _chat_content(item.get("content") or [])})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {
                    "name": str(item.get("name") or ""),
                    "arguments": str(item.get("arguments") or ""),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last["content"] = last["content"] or None
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    return messages


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for tool in tools:
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise BadRequest("only function tools are supported")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def chat_body(request: ResponsesRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    if request.instructions:
        body["messages"] = [{"role": "system", "content": request.instructions}, *messages]
    for source, target in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
    ):
        value = getattr(request, source)
        if value is not None:
            body[target] = value
    tools = _chat_tools(request.tools)
    if tools:
        body["tools"] = tools
    choice = request.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        body["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif isinstance(choice, str):
        body["tool_choice"] = choice
    if request.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    fmt = (request.text or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif fmt.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# -- output ------------------------------------------------------------------------------------------


def message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]
        if status == "completed"
        else [],
    }


def function_call_item(
    call_id: str, name: str, arguments: str, item_id: str | None = None, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id or new_id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id or new_id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat completion's message as output items: reasoning, text, then function calls."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(message["content"]))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        items.append(
            function_call_item(
                call.get("id") or new_id("call"), function.get("name", ""), function.get("arguments", "")
            )
        )
    return items


def usage_of(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    response_id: str,
    request: ResponsesRequest,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    incomplete = status == "completed" and finish_reason == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "incomplete" if incomplete else status,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": request.store,
        "temperature": request.temperature,
        "text": request.text or {"format": {"type": "text"}},
        "tool_choice": request.tool_choice or "auto",
        "tools": request.tools or [],
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": usage_of(usage) if usage is not None else None,
        "user": request.user,
        "metadata": request.metadata or {},
    }


# -- stored responses ----------------------------------------------------------------------------------


class StoredResponse:
    """A response kept for `GET`, `input_items` and `previous_response_id`: held as JSON, so that its size
    in memory is what the store counts (and what a caller gets back is its own copy)."""

    def __init__(
        self,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        conversation: list[dict[str, Any]],  # chat messages up to and including this response's output
    ) -> None:
        self.id: str = response["id"]
        self._parts = tuple(
            json.dumps(part, ensure_ascii=False).encode() for part in (response, input_items, conversation)
        )
        self.size = sum(len(part) for part in self._parts)
        self.stored_at = 0.0  # set by the store

    @property
    def response(self) -> dict[str, Any]:
        return json.loads(self._parts[0])  # type: ignore[no-any-return]

    @property
    def input_items(self) -> list[dict[str, Any]]:
        return json.loads(self._parts[1])  # type: ignore[no-any-return]

    @property
    def conversation(self) -> list[dict[str, Any]]:
        return json.loads(self._parts[2])  # type: ignore[no-any-return]


def store_budget() -> int:
    """`MODEL_RUNNER_RESPONSES_MAX_BYTES` (e.g. `64MiB`): what stored responses may hold (128 MiB)."""
    return env_bytes("MODEL_RUNNER_RESPONSES_MAX_BYTES", DEFAULT_STORE_BYTES)


class ResponseStore:
    """In memory, bounded in age (DMR's 1 h), in count and in bytes: the least recently used go first, and
    a response larger than the whole budget is not kept (a later `previous_response_id` to it is a 404, as
    to any response no longer kept)."""

    def __init__(
        self, max_items: int = MAX_STORED, max_age: float = MAX_AGE_SECONDS, max_bytes: int | None = None
    ) -> None:
        self.max_items = max_items
        self.max_age = max_age
        self.max_bytes = store_budget() if max_bytes is None else max_bytes
        self.size = 0  # bytes held
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()  # least recently used first
        self._by_age: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first

    def _drop(self, response_id: str) -> StoredResponse | None:
        item = self._items.pop(response_id, None)
        if item is not None:
            del self._by_age[response_id]
            self.size -= item.size
        return item

    def _expire(self) -> None:
        deadline = time.monotonic() - self.max_age
        while self._by_age and next(iter(self._by_age.values())).stored_at < deadline:
            self._drop(next(iter(self._by_age)))
        while len(self._items) > self.max_items or self.size > self.max_bytes:
            self._drop(next(iter(self._items)))

    def put(self, item: StoredResponse) -> None:
        self._drop(item.id)
        if item.size > self.max_bytes:
            return
        item.stored_at = time.monotonic()
        self._items[item.id] = self._by_age[item.id] = item
        self.size += item.size
        self._expire()

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        item = self._items.get(response_id)
        if item is not None:
            self._items.move_to_end(response_id)
        return item

    def delete(self, response_id: str) -> bool:
        self._expire()
        return self._drop(response_id) is not None

    def __len__(self) -> int:
        return len(self._items)


# -- streaming -------------------------------------------------------------------------------------


class EventWriter:
    """Turns chat completion chunks into Responses streaming events, and remembers the output."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text = ""
        self._calls: dict[int, dict[str, Any]] = {}

    def event(self, kind: str, **fields: Any) -> bytes:
        doc = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(doc)}\n\n".encode()

    def _start(self, item: dict[str, Any]) -> list[bytes]:
        events = self.close_item()
        self._open = item
        self._text = ""
        self.output.append(item)
        events.append(self.event("response.output_item.added", output_index=len(self.output) - 1, item=item))
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(self._content_event("response.content_part.added", part=part))
        return events

    def _content_event(self, kind: str, **fields: Any) -> bytes:
        assert self._open is not None
        index = len(self.output) - 1
        return self.event(kind, item_id=self._open["id"], output_index=index, content_index=0, **fields)

    def text(self, delta: str) -> list[bytes]:
        events = (
            []
            if self._open and self._open["type"] == "message"
            else self._start(message_item("", status="in_progress"))
        )
        self._text += delta
        return [*events, self._content_event("response.output_text.delta", delta=delta, logprobs=[])]

    def reasoning(self, delta: str) -> list[bytes]:
        events = [] if self._open and self._open["type"] == "reasoning" else self._start(reasoning_item(""))
        self._text += delta
        return [*events, self._content_event("response.reasoning_text.delta", delta=delta)]

    def tool_calls(self, deltas: list[dict[str, Any]]) -> list[bytes]:
        events: list[bytes] = []
        for delta in deltas:
            index = int(delta.get("index", 0))
            function = delta.get("function") or {}
            if index not in self._calls:
                item = function_call_item(delta.get("id") or new_id("call"), "", "", status="in_progress")
                self._calls[index] = item
                events += self._start(item)
            item = self._calls[index]
            item["name"] += function.get("name") or ""
            piece = function.get("arguments") or ""
            if piece:
                item["arguments"] += piece
                events.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=self.output.index(item),
                        delta=piece,
                    )
                )
        return events

    def close_item(self) -> list[bytes]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = self.output.index(item)
        events = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": self._text, "annotations": []}
            self._open = item  # for the content events' ids
            events.append(self._content_event("response.output_text.done", text=self._text, logprobs=[]))
            events.append(self._content_event("response.content_part.done", part=part))
            self._open = None
            item["content"] = [part]
        elif item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": self._text}]
            self._open = item
            events.append(self._content_event("response.reasoning_text.done", text=self._text))
            self._open = None
        else:
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        item["status"] = "completed" if item["type"] != "reasoning" else item.get("status")
        if item["type"] == "reasoning":
            item.pop("status", None)
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events
