"""A Messages request whose tool choice llama-server would not keep, served through chat completions.

llama-server b11434 translates `/v1/messages` itself (tools/server/server-chat.cpp), but maps `any` and
a named `tool` both to "required", which gets a grammar only when the template analysis found how the
template writes a call (most small models' templates have none), passes on no `response_format` or
grammar, and does not convert `none` at all (it falls back to "auto"). So on llama.cpp such a request is
translated here to a chat request, which goes through the forced-choice path of chat completions
(compat/tool_choice.py: the call's JSON schema as the grammar, compat/tool_rescue.py makes the answer a
call), and the chat completion comes back as an Anthropic message with `tool_use` blocks; a streamed one as
Anthropic's events of that whole message (the rescue needs the whole call anyway). Other requests keep
going to the engine's own `/v1/messages`; vLLM's (0.32, entrypoints/anthropic/serving.py) maps any,
tool and none to their chat equivalents, which it enforces, so it keeps them too.

The messages become Responses-style items first, so that compat/responses.py's `chat_messages` (an
assistant's text and calls as one turn, a tool's output as a `tool` message) is the one translation.

Thinking, as llama-server's own translation has it (server-chat.cpp): a past assistant turn's `thinking`
blocks go to the engine as that turn's `reasoning_content` (llama-server parses it on chat messages;
templates that render past reasoning, Qwen3's, read it, others leave it out), and the engine's reasoning
comes back as a `thinking` block, signed as on every route (compat/thinking_signature.py).
"""

from __future__ import annotations

import json
from typing import Any

from modelrunner.compat import responses
from modelrunner.compat.anthropic import blocks, event, new_message
from modelrunner.compat.assemble import MESSAGES
from modelrunner.compat.thinking_signature import signature, signature_delta
from modelrunner.compat.tool_rescue import new_call_id
from modelrunner.errors import BadRequest

KEPT_CHOICES = ("any", "tool", "none")  # the choices llama-server's own translation loses
_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
_SAMPLING = (("max_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"))


def through_chat(daemon_forces: bool, path: str, doc: dict[str, Any]) -> bool:
    """Whether a Messages request is served through chat completions (the module says why); `daemon_forces`:
    the engine does not apply a forced tool choice itself (`Engine.ignores_forced_tool_choice`)."""
    choice = doc.get("tool_choice")
    return (
        daemon_forces
        and path == MESSAGES
        and isinstance(choice, dict)
        and choice.get("type") in KEPT_CHOICES
        and bool(doc.get("tools"))
    )


# -- request ---------------------------------------------------------------------------------------------


def chat_request(doc: dict[str, Any]) -> dict[str, Any]:
    """The chat request of a (checked) Messages request. It is asked for unstreamed: the daemon streams the
    finished message itself, and asks llama.cpp for a stream it assembles (compat/assemble.py)."""
    items: list[dict[str, Any]] = []
    system = _text_of(doc.get("system"), "system")
    if system:
        items.append(_message_item("system", [{"type": "text", "text": system}]))
    messages = responses.chat_messages(items)
    for role, content in _turns(doc["messages"]):
        turn = responses.chat_messages(_items(role, content))
        thinking = _thinking(content) if role == "assistant" else ""
        if thinking:  # on the turn's first message, as the turn renders it first
            turn = turn or [{"role": "assistant", "content": ""}]
            turn[0]["reasoning_content"] = thinking
        messages += turn
    body: dict[str, Any] = {"model": doc["model"], "messages": messages}
    for source, target in _SAMPLING:
        if doc.get(source) is not None:
            body[target] = doc[source]
    if doc.get("top_k") is not None:
        body["top_k"] = doc["top_k"]  # llama-server's own sampling field
    if doc.get("stop_sequences"):
        body["stop"] = doc["stop_sequences"]
    asked = doc.get("thinking")
    if isinstance(asked, dict) and asked.get("type") == "enabled":  # as llama-server's own Messages
        body["thinking_budget_tokens"] = asked.get("budget_tokens", 10000)
    body["tools"] = [_function(tool) for tool in doc["tools"] if _is_custom(tool)]
    choice = doc["tool_choice"]
    if choice["type"] == "any":
        body["tool_choice"] = "required"
    elif choice["type"] == "tool":
        body["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        body["tool_choice"] = "none"
    if choice.get("disable_parallel_tool_use"):
        body["parallel_tool_calls"] = False
    return body


def _is_custom(tool: Any) -> bool:
    """A client tool (with an input schema); a server tool (web search ...) is not the client's to call,
    as compat/tool_rescue.py's `declared` reads them."""
    return isinstance(tool, dict) and "input_schema" in tool


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _turns(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The conversation's turns, consecutive assistant messages as one (Anthropic's API combines them, and
    an assistant's text and the calls after it are one chat turn)."""
    turns: list[tuple[str, Any]] = []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "assistant" and turns and turns[-1][0] == "assistant":
            content = blocks(turns.pop()[1]) + blocks(content)
        turns.append((role, content))
    return turns


def _thinking(content: Any) -> str:
    """The reasoning of a past assistant turn (its `thinking` blocks; a `redacted_thinking` block's data is
    encrypted by Anthropic: nothing a local model can read)."""
    if isinstance(content, str):
        return ""
    return "".join(str(b.get("thinking") or "") for b in content if b.get("type") == "thinking")


def _message_item(role: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": parts}


def _items(role: str, content: Any) -> list[dict[str, Any]]:
    """One Messages turn as Responses items: text and images, `tool_use` as function calls, `tool_result`
    as their outputs (thinking goes beside them: `_thinking`)."""
    if isinstance(content, str):
        return [_message_item(role, [{"type": "text", "text": content}])]
    items: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        elif kind == "image":
            parts.append({"type": "input_image", "image_url": _image_url(block.get("source"), i)})
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            if parts:  # what came before the call or result stays before it
                items.append(_message_item(role, parts))
                parts = []
            items.append(_call_item(role, kind, block, i))
    if parts:
        items.append(_message_item(role, parts))
    return items


def _call_item(role: str, kind: object, block: dict[str, Any], i: int) -> dict[str, Any]:
    if kind == "tool_use" and role == "assistant":
        call_id, name = block.get("id"), block.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise BadRequest(f"content.{i}.tool_use: id and name must be strings")
        arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
        return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
    if kind == "tool_result" and role == "user":
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str):
            raise BadRequest(f"content.{i}.tool_result.tool_use_id: Field required")
        output = _text_of(block.get("content"), f"content.{i}.tool_result.content")
        return {"type": "function_call_output", "call_id": call_id, "output": output}
    raise BadRequest(f"content.{i}: a {role} message cannot have a content block of type {str(kind)[:40]!r}")


def _text_of(content: Any, where: str) -> str:
    """A system prompt's or a tool result's text: a string or text blocks."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "\n".join(str(block.get("text") or "") for block in content)
    raise BadRequest(f"{where}: only text is supported here")


def _image_url(source: Any, i: int) -> str:
    if isinstance(source, dict) and source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    raise BadRequest(f"content.{i}.image.source: a base64 or url source is required")


# -- answer ----------------------------------------------------------------------------------------------


def message(completion: dict[str, Any], model: str) -> dict[str, Any]:
    """A chat completion (its calls already rescued) as the Anthropic message `model` answered."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    answer = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if answer.get("reasoning_content"):
        thinking = answer["reasoning_content"]
        content.append({"type": "thinking", "thinking": thinking, "signature": signature(thinking)})
    if answer.get("content"):
        content.append({"type": "text", "text": answer["content"]})
    for call in answer.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}  # the rescue gives only calls whose arguments validate
        content.append(
            {
                "type": "tool_use",
                "id": new_call_id("toolu_"),
                "name": function.get("name"),
                "input": arguments,
            }
        )
    out = new_message(model)
    finish = choice.get("finish_reason")
    stop_reason = "tool_use" if answer.get("tool_calls") else _STOP_REASONS.get(finish or "", "end_turn")
    return {**out, "content": content, "stop_reason": stop_reason, "usage": usage(completion.get("usage"))}


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any]:
    """Chat usage in Anthropic's terms: `input_tokens` is the prompt less what the prefix cache served
    (`cache_read_input_tokens`), as llama-server's own Messages answers count."""
    counted = responses.usage_of(chat_usage)
    cached = counted["input_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": counted["input_tokens"] - cached,
        "cache_read_input_tokens": cached,
        "output_tokens": counted["output_tokens"],
    }


def message_events(done: dict[str, Any]) -> list[bytes]:
    """The Messages stream of a finished message: its start, each block, its stop reason and end (a
    thinking block's signature in a `signature_delta` before its stop, as Anthropic streams it)."""
    start = {**done, "content": [], "stop_reason": None, "usage": {**done["usage"], "output_tokens": 0}}
    events = [event({"type": "message_start", "message": start})]
    for index, block in enumerate(done["content"]):
        kind = block["type"]
        if kind == "tool_use":
            opened, delta = {**block, "input": {}}, {"type": "input_json_delta", "partial_json": ""}
            delta["partial_json"] = json.dumps(block["input"], ensure_ascii=False)
        elif kind == "thinking":
            opened = {**block, "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            opened, delta = {**block, "text": ""}, {"type": "text_delta", "text": block["text"]}
        events.append(event({"type": "content_block_start", "index": index, "content_block": opened}))
        events.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
        if kind == "thinking":
            events.append(event(signature_delta(index, block["thinking"])))
        events.append(event({"type": "content_block_stop", "index": index}))
    stop = {"stop_reason": done["stop_reason"], "stop_sequence": None}
    events.append(event({"type": "message_delta", "delta": stop, "usage": done["usage"]}))
    events.append(event({"type": "message_stop"}))
    return events
