"""OpenAI Responses API shapes, their translation to chat completions, and the store of past responses.

llama-server (b11434) has a stateless `/v1/responses` that refuses `previous_response_id`, and other
engines have none, so responses are translated here to chat completions (as DMR does): that gives
every engine the same API, with stored responses for `GET`, `input_items` and chaining.

What Codex (0.171, `wire_api = "responses"`; tests/golden/codex_0_171_request.json) sends on every request
is taken as the API has it, within what a local engine can do:

* `include: ["reasoning.encrypted_content"]`: each reasoning item carries an `encrypted_content` that gives
  its reasoning back when the item returns in `input` (Codex keeps no state on the server: `store: false`).
  It is not a secret (a local model's reasoning is the user's own): the text in base64 with the digest
  that says the daemon wrote it (the thinking blocks' signature, compat/thinking_signature.py;
  `decrypted_reasoning`); one the daemon cannot read (OpenAI's, another provider's) is ignored, as the
  reasoning of a turn the engine did not write.
* `namespace` tools (a named group of function tools): each function goes to the engine as
  `NAMESPACE__NAME` (`flat_name`), and a call of it comes back as OpenAI answers one, `name` and
  `namespace` apart (`FunctionNames`).
* hosted tools (`web_search`, `file_search`, `code_interpreter`, ...: run by OpenAI's servers, or by a
  client for a tool type the engine has no translation of): not available here, so they are dropped, not
  refused (Codex always declares `web_search`); `dropped_tools` names them for the router's response
  header and log line.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
import uuid
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from modelrunner.compat.bodies import validated
from modelrunner.compat.thinking_signature import signature
from modelrunner.errors import BadRequest
from modelrunner.scheduler.memory import env_bytes
from modelrunner.wire import sse_event

MAX_STORED = 1000
MAX_AGE_SECONDS = 3600.0
DEFAULT_STORE_BYTES = 128 * 2**20
# OpenAI's limits of `metadata`: at most 16 pairs, keys up to 64 characters, values strings up to 512
METADATA_PAIRS, METADATA_KEY_LENGTH, METADATA_VALUE_LENGTH = 16, 64, 512

# Parameters we cannot honour: refused rather than silently ignored (the contract's list).
_REJECTED = (
    "stream_options",
    "top_logprobs",
    "background",
    "conversation",
    "prompt",
    "service_tier",
    "safety_identifier",
)


# `include` values: the one honoured, and those about output this API never makes here (hosted tools'
# calls are dropped, input images are listed as sent); logprobs and anything else are refused.
ENCRYPTED_REASONING = "reasoning.encrypted_content"
_INCLUDES = (
    ENCRYPTED_REASONING,
    "message.input_image.image_url",
    "web_search_call.results",
    "web_search_call.action.sources",
    "file_search_call.results",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
)
_TOOL_TYPE = re.compile(r"[a-z0-9_.-]{1,64}")
_NAMESPACE_SEPARATOR = "__"  # a word character: tool-call parsers read names as \w+ (Functionary's ...)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


MAX_INPUT_ITEMS = 100_000


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
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
    include: list[str] | None = None

    @field_validator("input")
    @classmethod
    def _bounded_items(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        """A list of at most MAX_INPUT_ITEMS items; a string is bounded by the body's size limit alone (one
        bound on both made a long prompt a 400 about items)."""
        if isinstance(value, list) and len(value) > MAX_INPUT_ITEMS:
            raise ValueError(f"at most {MAX_INPUT_ITEMS} input items are allowed")
        return value

    def encrypts_reasoning(self) -> bool:
        return ENCRYPTED_REASONING in (self.include or [])


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
    _check_include(doc.get("include"))
    if doc.get("truncation") not in (None, "disabled"):
        raise BadRequest("only truncation 'disabled' is supported")
    checked = validated(ResponsesRequest, doc)
    _check_tool_types(checked.tools)
    if not checked.input and not checked.previous_response_id:
        raise BadRequest("input: must not be empty")  # the engine would answer an empty conversation
    return checked


def _check_tool_types(tools: list[dict[str, Any]] | None) -> None:
    """Every tool, and every tool of a namespace group, has a type made of word characters (a dropped
    tool's type goes into a response header: `dropped_tools`)."""
    for i, tool in enumerate(tools or []):
        inner = tool.get("tools") if tool.get("type") == "namespace" else []
        for where, each in [(f"tools.{i}", tool)] + [
            (f"tools.{i}.tools.{j}", t) for j, t in enumerate(inner if isinstance(inner, list) else [])
        ]:
            kind = each.get("type") if isinstance(each, dict) else None
            if not isinstance(kind, str) or not _TOOL_TYPE.fullmatch(kind):
                raise BadRequest(f"{where}.type: a tool needs a type", param="tools")


def _check_include(include: Any) -> None:
    if include is None:
        return
    if not isinstance(include, list) or not all(isinstance(value, str) for value in include):
        raise BadRequest("include: must be a list of strings", param="include")
    for value in include:
        if value not in _INCLUDES:
            raise BadRequest(f"include: {value[:80]!r} is not supported", param="include")


# -- reasoning that round-trips -----------------------------------------------------------------------

_ENCRYPTED_PREFIX = "modelrunner."


def encrypted_reasoning(text: str) -> str:
    """The `encrypted_content` of a reasoning item the daemon answers (the module says what it is)."""
    sealed = json.dumps({"reasoning": text, "signature": signature(text)}, ensure_ascii=False)
    return _ENCRYPTED_PREFIX + base64.b64encode(sealed.encode()).decode()


def decrypted_reasoning(encrypted: Any) -> str | None:
    """The reasoning an `encrypted_content` holds, if the daemon made it; None for any other."""
    if not isinstance(encrypted, str) or not encrypted.startswith(_ENCRYPTED_PREFIX):
        return None
    try:
        sealed = json.loads(base64.b64decode(encrypted[len(_ENCRYPTED_PREFIX) :], validate=True))
    except (ValueError, binascii.Error, RecursionError):
        return None
    if not isinstance(sealed, dict) or not isinstance(sealed.get("reasoning"), str):
        return None
    text: str = sealed["reasoning"]
    return text if sealed.get("signature") == signature(text) else None


# -- tools: namespaces flattened, hosted tools dropped ---------------------------------------------------


def flat_name(namespace: str, name: str) -> str:
    """The engine's name of the function `name` of a namespace group."""
    return f"{namespace}{_NAMESPACE_SEPARATOR}{name}"


class FunctionNames:
    """The functions a request declares in namespace groups, by the name the engine knows them by: a call
    of one is answered with its own `name` and its `namespace`, as Codex parses it."""

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self.namespaced: dict[str, tuple[str, str]] = {}
        for tool in tools or []:
            group = tool.get("name")
            if tool.get("type") == "namespace" and isinstance(group, str):
                for inner in _functions_of(tool):
                    if isinstance(inner.get("name"), str):
                        self.namespaced[flat_name(group, inner["name"])] = (group, inner["name"])

    def apply(self, item: dict[str, Any]) -> None:
        """A function call item named as the client declared its function."""
        found = self.namespaced.get(item.get("name") or "")
        if found is not None:
            item["namespace"], item["name"] = found


def _functions_of(group: dict[str, Any]) -> list[dict[str, Any]]:
    inner = group.get("tools")
    return (
        [t for t in inner if isinstance(t, dict) and t.get("type") == "function"]
        if isinstance(inner, list)
        else []
    )


def dropped_tools(tools: list[dict[str, Any]] | None) -> list[str]:
    """The types of the declared tools the engine does not get (hosted tools, anything but functions),
    in the order declared, once each."""
    dropped: list[str] = []
    for tool in tools or []:
        inner = tool.get("tools") if tool.get("type") == "namespace" else [tool]
        for each in inner if isinstance(inner, list) else []:
            kind = str(each.get("type"))  # checked (`_check_tool_types`)
            if kind != "function" and kind not in dropped:
                dropped.append(kind)
    return dropped


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
    calls: no empty turn of its own). A reasoning item the daemon made gives that turn its
    `reasoning_content` back (llama-server hands it to templates that render past reasoning)."""
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # of the assistant turn that comes next
    for item in items:
        kind = item.get("type")
        if kind == "reasoning":
            reasoning = decrypted_reasoning(item.get("encrypted_content"))
            continue
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _chat_content(item.get("content") or [])})
        elif kind == "function_call":
            name = str(item.get("name") or "")
            if isinstance(item.get("namespace"), str):
                name = flat_name(item["namespace"], name)
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": name, "arguments": str(item.get("arguments") or "")},
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
        if reasoning is not None and messages and messages[-1]["role"] == "assistant":
            turn = messages[-1]  # a turn's reasoning items (interleaved with its calls) are one text
            turn["reasoning_content"] = turn.get("reasoning_content", "") + reasoning
        reasoning = None  # a reasoning item not followed by the assistant's is of no turn here
    return messages


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The function tools, those of namespace groups under their flat names; the rest is dropped
    (`dropped_tools`)."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") == "function":
            out.append(_chat_function(tool, f"tools.{i}"))
        elif tool.get("type") == "namespace":
            if not isinstance(tool.get("name"), str) or not isinstance(tool.get("tools"), list):
                raise BadRequest(f"tools.{i}: a namespace needs a name and its tools", param="tools")
            for inner in _functions_of(tool):
                function = _chat_function(inner, f"tools.{i}.tools")
                function["function"]["name"] = flat_name(tool["name"], inner["name"])
                out.append(function)
    return out or None


def _chat_function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise BadRequest(f"{where}: a function tool needs a name", param="tools")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": function}


def _one_system_prompt(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system messages (instructions, developer messages: Codex sends two) as one, paragraphs
    apart: templates take one system message at the start and refuse a second (llama.cpp's
    models/templates/Qwen3.5-4B.jinja: "System message must be at the beginning.")."""
    leading = 0
    while (
        leading < len(messages)
        and messages[leading]["role"] == "system"
        and isinstance(messages[leading]["content"], str)
    ):
        leading += 1
    if leading < 2:
        return messages
    joined = "\n\n".join(message["content"] for message in messages[:leading])
    return [{"role": "system", "content": joined}, *messages[leading:]]


def chat_body(request: ResponsesRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    if request.instructions:
        messages = [{"role": "system", "content": request.instructions}, *messages]
    body: dict[str, Any] = {"model": request.model, "messages": _one_system_prompt(messages)}
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
        name = choice.get("name")
        if isinstance(choice.get("namespace"), str) and isinstance(name, str):
            name = flat_name(choice["namespace"], name)
        body["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif isinstance(choice, str):  # (a hosted tool's choice goes with the tool: `dropped_tools`)
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


def reasoning_item(text: str, item_id: str | None = None, encrypted: bool = False) -> dict[str, Any]:
    """A reasoning item; `encrypted`: with the `encrypted_content` that gives it back (`include`)."""
    item = {
        "type": "reasoning",
        "id": item_id or new_id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }
    if encrypted:
        item["encrypted_content"] = encrypted_reasoning(text)
    return item


def output_items(message: dict[str, Any], request: ResponsesRequest | None = None) -> list[dict[str, Any]]:
    """A chat completion's message as output items: reasoning, text, then function calls (named as the
    `request` declared them)."""
    items = []
    if message.get("reasoning_content"):
        encrypted = request is not None and request.encrypts_reasoning()
        items.append(reasoning_item(message["reasoning_content"], encrypted=encrypted))
    if message.get("content"):
        items.append(message_item(message["content"]))
    names = FunctionNames(request.tools if request is not None else None)
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        item = function_call_item(
            call.get("id") or new_id("call"), function.get("name", ""), function.get("arguments", "")
        )
        names.apply(item)
        items.append(item)
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
    """Turns chat completion chunks into Responses streaming events, and remembers the output (as the
    `request` asks for it: reasoning with its `encrypted_content`, calls named as declared)."""

    def __init__(self, request: ResponsesRequest | None = None) -> None:
        self.encrypted = request is not None and request.encrypts_reasoning()
        self.names = FunctionNames(request.tools if request is not None else None)
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text = ""
        self._calls: dict[int, dict[str, Any]] = {}

    def event(self, kind: str, **fields: Any) -> bytes:
        doc = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(kind, json.dumps(doc).encode())

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
            if self.encrypted:
                item["encrypted_content"] = encrypted_reasoning(self._text)
            self._open = item
            events.append(self._content_event("response.reasoning_text.done", text=self._text))
            self._open = None
        else:
            self.names.apply(item)
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
