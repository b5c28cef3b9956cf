"""Anthropic Messages shapes: what a request must look like before it reaches an engine, and error bodies.

The engine (llama-server's native `/v1/messages`) does the translation to its chat template; these models
only check the request, so that malformed bodies get Anthropic's `invalid_request_error` with a 400 rather
than whatever status the engine would pick (llama-server answers 500 to a body without `messages`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from modelrunner.compat.bodies import validated
from modelrunner.compat.ollama import timestamp_text
from modelrunner.display import display_name
from modelrunner.errors import BadRequest
from modelrunner.wire import sse_event

# HTTP status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def new_message(model: str, input_tokens: int = 0) -> dict[str, Any]:
    """The message a `message_start` event opens, for a stream that lacks one (llama-server b11434 skips it
    when the first tokens are an incomplete UTF-8 sequence it holds back), with the prompt's tokens when
    they were counted (the engine's `message_delta` carries the output count)."""
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }


def event(doc: dict[str, Any]) -> bytes:
    """One event of a Messages stream, named by its type as Anthropic names them."""
    return sse_event(str(doc.get("type")), json.dumps(doc, ensure_ascii=False).encode())


def message_start_event(model: str, input_tokens: int = 0) -> bytes:
    """A `message_start` event for a stream that lacks one (`new_message`)."""
    return event({"type": "message_start", "message": new_message(model, input_tokens)})


def model_object(model_id: str, created: int) -> dict[str, Any]:
    """A model as Anthropic's Models API shows it (`created` in unix seconds)."""
    return {
        "type": "model",
        "id": model_id,
        "display_name": display_name(model_id),
        "created_at": timestamp_text(created),
    }


def model_page(
    models: list[dict[str, Any]], limit: int, after_id: str | None, before_id: str | None
) -> dict[str, Any]:
    """One page of Anthropic's model list (newest first, as Anthropic lists them): at most `limit` models
    after `after_id` or before `before_id`, with the cursors its SDKs page with."""
    ordered = sorted(models, key=lambda m: m["created_at"], reverse=True)
    ids = [m["id"] for m in ordered]
    for name, cursor in (("after_id", after_id), ("before_id", before_id)):
        if cursor is not None and cursor not in ids:
            raise BadRequest(f"{name}: no model {cursor[:200]!r}")
    if before_id is not None:
        end = ids.index(before_id)
        page, more = ordered[max(0, end - limit) : end], end > limit
    else:
        start = ids.index(after_id) + 1 if after_id is not None else 0
        page, more = ordered[start : start + limit], start + limit < len(ordered)
    return {
        "data": page,
        "has_more": more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


class ContentBlock(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = Field(min_length=1)


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    input_schema: dict[str, Any] | None = None


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    messages: list[Message] = Field(max_length=100_000)
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None


class MessagesRequest(CountTokensRequest):
    messages: list[Message] = Field(min_length=1, max_length=100_000)
    max_tokens: int = Field(ge=1)  # required, as Anthropic's API has it: the engine would fill its context
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None


def check_request(doc: dict[str, Any], count_tokens: bool) -> CountTokensRequest:
    return validated(CountTokensRequest if count_tokens else MessagesRequest, doc, prefix="")


# -- system messages inside `messages` ---------------------------------------------------------------


def with_system_messages_placed(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with its `role: "system"` messages (Claude Code 2.1.19x sends them under the beta
    `mid-conversation-system-2026-04-07`, after the last user message) moved where every chat template can
    take them; `doc` itself when it has none.

    Both of the engine's paths (llama-server's own Messages translation and compat/anthropic_chat.py) would
    hand such a message to the chat template as a system message in the middle of the conversation, and
    templates refuse that (llama.cpp's models/templates: Qwen3.5 raises "System message must be at the
    beginning.", Mistral Nemo and Small 3.2 "conversation roles must alternate"). So:

    * the system messages before the first user or assistant message join the top-level `system`, after
      its blocks: the one system prompt every template renders first;
    * a later one becomes text in the user turn next to it, inside `<system-reminder>` tags (what Claude
      Code itself sends when a server refuses the beta: its log says "falling back to <system-reminder>
      body"), so that the model can tell it from the user's words: appended to the user message right
      before it, or, after an assistant message, put into the user message right after it (behind that
      message's `tool_result` blocks, which must stay first); with no user message beside it, a user
      message of its own. Joining the turn before it first keeps the next request's prompt an extension
      of this one's (prefix cache): Claude Code sends the system message at the same place again.
    """
    messages = doc.get("messages")
    if not isinstance(messages, list) or not any(_is_system(m) for m in messages):
        return doc
    leading: list[dict[str, Any]] = []  # system text before the conversation
    placed: list[Any] = []
    waiting: list[dict[str, Any]] = []  # system text for the next user message (after an assistant's)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):  # check_request says what is wrong with it
            placed.append(message)
            continue
        if not _is_system(message):
            if waiting and message.get("role") == "user":
                message = {**message, "content": _with_text_after_results(message.get("content"), waiting)}
                waiting = []
            elif waiting:
                placed.append({"role": "user", "content": waiting})
                waiting = []
            placed.append(message)
            continue
        text = _system_text(message.get("content"), i)
        if not placed:
            leading += text
        elif isinstance(placed[-1], dict) and placed[-1].get("role") == "user":
            placed[-1] = {**placed[-1], "content": blocks(placed[-1].get("content")) + _reminders(text)}
        else:
            waiting += _reminders(text)
    if waiting:
        placed.append({"role": "user", "content": waiting})
    out = {**doc, "messages": placed}
    if leading:
        system = doc.get("system")
        out["system"] = (blocks(system) if system else []) + leading
    return out


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "system"


def blocks(content: Any) -> list[Any]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _system_text(content: Any, i: int) -> list[dict[str, Any]]:
    """A system message's content as text blocks (a string, or text blocks, with their cache_control)."""
    text = blocks(content)
    if not isinstance(content, (str, list)) or not all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in text
    ):
        raise BadRequest(f"messages.{i}.content: a system message holds a string or text blocks only")
    return [dict(b) for b in text]


def _reminders(text: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**block, "text": f"<system-reminder>\n{block['text']}\n</system-reminder>"} for block in text]


def _with_text_after_results(content: Any, text: list[dict[str, Any]]) -> list[Any]:
    """A user message's content with `text` behind its leading `tool_result` blocks."""
    held = blocks(content)
    at = 0
    while at < len(held) and isinstance(held[at], dict) and held[at].get("type") == "tool_result":
        at += 1
    return held[:at] + text + held[at:]
