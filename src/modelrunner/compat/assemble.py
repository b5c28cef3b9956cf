"""A streamed answer put back together as the engine would have answered the same request unstreamed.

llama-server (b11434) notices a client that left only between streamed chunks: a non-streamed generation
runs to its end, or until an idle second of its result queue (which never comes while other requests
stream). So the daemon asks llama.cpp for a stream even when the client did not, and closes it when the
client leaves; these assemblers rebuild the non-streamed answer from the events, field for field as
llama-server builds it (tools/server/server-task.cpp: `to_json_oaicompat_chat`, `to_json_oaicompat`,
`to_json_anthropic`): message, tool calls, reasoning, log-probabilities, usage, timings, finish reason.
The recorder uses them too, to show a streamed response whole (DMR's `convertStreamingResponse`).

Only single-choice requests are converted (`streamable`): with `n` > 1 or several prompts llama-server
merges its answers in ways a stream does not show.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from modelrunner.compat.anthropic import new_message
from modelrunner.wire import SSEDecoder, document_message, event_document

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
_TOP_KEYS = ("choices", "created", "model", "system_fingerprint", "object", "usage", "id")  # their order


class AssemblyError(Exception):
    """The stream ended before its answer was complete, or reported an error (`status`, `body`)."""

    def __init__(self, message: str, status: int = 500, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def streamable(path: str, doc: dict[str, Any]) -> bool:
    """Whether a non-streamed request to `path` can be asked for as a stream and assembled exactly."""
    if path not in (CHAT, COMPLETIONS, MESSAGES) or doc.get("stream"):
        return False
    if doc.get("n", 1) != 1 or doc.get("n_cmpl", 1) != 1:
        return False
    prompt = doc.get("prompt")
    return path != COMPLETIONS or isinstance(prompt, str) or _is_token_list(prompt)


def _is_token_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def streamed_request(path: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The request asked for as a stream; OpenAI streams then carry usage (an unstreamed answer always
    has it)."""
    out = {**doc, "stream": True}
    if path != MESSAGES:
        out["stream_options"] = {**(doc.get("stream_options") or {}), "include_usage": True}
    return out


class Assembler(ABC):
    """Feed it the stream's bytes; `result()` is the unstreamed answer."""

    def __init__(self) -> None:
        self.decoder = SSEDecoder()
        self.done = False

    def feed(self, data: bytes) -> None:
        for event, payload in self.decoder.feed(data):
            if payload == b"[DONE]":
                self.done = True
                continue
            if (doc := event_document(payload)) is not None:
                self.add(event, doc)

    @abstractmethod
    def add(self, event: str | None, doc: dict[str, Any]) -> None:
        """Take one event of the stream."""

    @abstractmethod
    def result(self) -> dict[str, Any]:
        """The unstreamed answer, or AssemblyError when the stream did not complete it."""


def assembler_for(path: str, model: str = "") -> Assembler:
    """The assembler of a path's stream; `model` (the name the client asked for) fills in an Anthropic
    message whose stream did not open with `message_start`."""
    if path == MESSAGES:
        return MessageAssembler(model)
    return CompletionAssembler() if path == COMPLETIONS else ChatAssembler()


def _raise_error(doc: dict[str, Any]) -> None:
    """llama-server ends a stream that fails with `data: {"error": {...}}`; unstreamed, the same error
    would have been the answer, with its code as the status."""
    error = doc["error"]
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    raise AssemblyError(document_message(doc) or "the engine failed", status, {"error": error})


class _OpenAIAssembler(Assembler):
    def __init__(self) -> None:
        super().__init__()
        self.top: dict[str, Any] = {}
        self.finish: dict[int, str] = {}
        self.logprobs: dict[int, list[Any]] = {}

    def add(self, event: str | None, doc: dict[str, Any]) -> None:
        if "error" in doc and "choices" not in doc:
            _raise_error(doc)
        for key, value in doc.items():
            if key not in ("choices", "object", "prompt_progress"):
                self.top[key] = value
        for choice in doc.get("choices") or []:
            index = int(choice.get("index") or 0)
            self.add_choice(index, choice)
            if choice.get("finish_reason"):
                self.finish[index] = choice["finish_reason"]
            content = (choice.get("logprobs") or {}).get("content")
            if content:
                self.logprobs.setdefault(index, []).extend(content)

    @abstractmethod
    def add_choice(self, index: int, choice: dict[str, Any]) -> None:
        """Take one choice's delta."""

    def indexes(self) -> list[int]:
        if not self.finish:
            raise AssemblyError("the engine's stream ended before the answer was complete")
        return sorted(self.finish)

    def wrap(self, choices: list[dict[str, Any]], kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {"choices": choices}
        for key in _TOP_KEYS[1:]:
            if key == "object":
                out["object"] = kind
            elif key in self.top:
                out[key] = self.top[key]
        for key, value in self.top.items():
            out.setdefault(key, value)  # timings, and whatever else the engine adds
        return out


class ChatAssembler(_OpenAIAssembler):
    def __init__(self) -> None:
        super().__init__()
        self.content: dict[int, list[str]] = {}
        self.reasoning: dict[int, list[str]] = {}
        self.calls: dict[int, dict[int, dict[str, str]]] = {}

    def add_choice(self, index: int, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self.content.setdefault(index, []).append(delta["content"])
        if isinstance(delta.get("reasoning_content"), str):
            self.reasoning.setdefault(index, []).append(delta["reasoning_content"])
        for piece in delta.get("tool_calls") or []:
            calls = self.calls.setdefault(index, {})
            call = calls.setdefault(int(piece.get("index") or 0), {"id": "", "name": "", "arguments": ""})
            call["id"] = call["id"] or str(piece.get("id") or "")
            function = piece.get("function") or {}
            call["name"] += str(function.get("name") or "")
            call["arguments"] += str(function.get("arguments") or "")

    def result(self) -> dict[str, Any]:
        choices = []
        for index in self.indexes():
            message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content.get(index, []))}
            if self.reasoning.get(index):
                message["reasoning_content"] = "".join(self.reasoning[index])
            calls = self.calls.get(index)
            if calls:
                message["tool_calls"] = [_tool_call(calls[i]) for i in sorted(calls)]
            choice: dict[str, Any] = {"finish_reason": self.finish[index], "index": index, "message": message}
            if self.logprobs.get(index):
                choice["logprobs"] = {"content": self.logprobs[index]}
            choices.append(choice)
        return self.wrap(choices, "chat.completion")


def _tool_call(call: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "function",
        "function": {"name": call["name"], "arguments": call["arguments"]},
    }
    if call["id"]:
        out["id"] = call["id"]
    return out


class CompletionAssembler(_OpenAIAssembler):
    def __init__(self) -> None:
        super().__init__()
        self.text: dict[int, list[str]] = {}

    def add_choice(self, index: int, choice: dict[str, Any]) -> None:
        if isinstance(choice.get("text"), str):
            self.text.setdefault(index, []).append(choice["text"])

    def result(self) -> dict[str, Any]:
        choices = []
        for index in self.indexes():
            logprobs = {"content": self.logprobs[index]} if self.logprobs.get(index) else None
            choices.append(
                {
                    "text": "".join(self.text.get(index, [])),
                    "index": index,
                    "logprobs": logprobs,
                    "finish_reason": self.finish[index],
                }
            )
        return self.wrap(choices, "text_completion")


class MessageAssembler(Assembler):
    """Anthropic's message from its events: `message_start`, content blocks by index, `message_delta`."""

    def __init__(self, model: str = "") -> None:
        super().__init__()
        self.model = model
        self.started = False  # a `message_start` opened the stream (llama-server may skip it)
        self.message: dict[str, Any] | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.inputs: dict[int, list[str]] = {}
        self.stopped = False

    def add(self, event: str | None, doc: dict[str, Any]) -> None:
        kind = doc.get("type") or event
        if kind == "error":
            raise AssemblyError(document_message(doc) or "the engine failed", 500, doc)
        if kind == "message_start":
            self.message = dict(doc.get("message") or {})
            self.started = True
        elif kind == "content_block_start":
            block = dict(doc.get("content_block") or {})
            if block.get("type") == "thinking":
                block.setdefault("signature", "")
            self.blocks[int(doc.get("index") or 0)] = block
        elif kind == "content_block_delta":
            self._delta(int(doc.get("index") or 0), doc.get("delta") or {})
        elif kind == "message_delta":
            message = self.message if self.message is not None else {}
            self.message = message
            message.update(doc.get("delta") or {})
            message["usage"] = {**(message.get("usage") or {}), **(doc.get("usage") or {})}
        elif kind == "message_stop":
            self.stopped = True

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text") or "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + str(delta.get("signature") or "")
        elif kind == "input_json_delta":
            self.inputs.setdefault(index, []).append(str(delta.get("partial_json") or ""))

    def result(self) -> dict[str, Any]:
        if not self.stopped or self.message is None:
            raise AssemblyError("the engine's stream ended before the message was complete")
        content = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.get("type") == "tool_use":
                try:
                    block["input"] = json.loads("".join(self.inputs.get(index, [])) or "{}")
                except ValueError:
                    block["input"] = {}
            content.append(block)
        message = self.message
        if not self.started:
            opened = new_message(self.model)
            usage = {**opened["usage"], **(message.get("usage") or {})}
            message = {**opened, **message, "usage": usage}
        return {**message, "content": content}
