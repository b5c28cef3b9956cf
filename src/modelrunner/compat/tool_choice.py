"""A forced tool choice, kept by the daemon where the engine would answer with text (issue 22 item 6).

llama-server b11434 ignores a forced choice in two ways (tools/server/server-common.cpp, common/chat.cpp):
it reads `tool_choice` as a string only, so a named function (an object) silently becomes "auto"; and
"required" builds a grammar only when its template analysis found how the template writes a call, which a
template that lists tools but renders no calls (most small models', the test model's) never gives. So on
llama.cpp a chat request that forces a call goes to the engine as `tool_choice: "none"` (the template still
renders the tools: the prompt, and its cache, stay the same) with a `response_format` schema of the call
objects it may write; the answer, `{"name": ..., "arguments": {...}}`, is then made a call by the rescue of
calls written as text (compat/tool_rescue.py), which checks the name and the arguments again.

A choice that names a tool the request does not declare is refused before a model loads, as the APIs do.

Anthropic `any` / `tool` (and `none`) on llama.cpp: llama-server's own `/v1/messages` passes on no
grammar and does not tell them apart, so the daemon serves such a request through chat completions, and so
through this same path (compat/anthropic_chat.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelrunner.compat.assemble import CHAT, MESSAGES
from modelrunner.compat.tool_rescue import Tools, declared
from modelrunner.errors import BadRequest


@dataclass(frozen=True)
class Forced:
    """The tools a request forces a call of: all it declares, or the one it names."""

    tools: Tools

    def call_schema(self) -> dict[str, Any]:
        """What the answer must be: one call object of a tool it may call."""
        return {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "arguments": schema or {"type": "object"}},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for name, schema in self.tools.items()
            ]
        }

    def engine_request(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The chat request as llama-server keeps the choice: the call's grammar, no tool parsing."""
        schema = {"name": "tool_call", "schema": self.call_schema()}
        return {
            **doc,
            "tool_choice": "none",
            "response_format": {"type": "json_schema", "json_schema": schema},
        }


def forced(path: str, doc: dict[str, Any]) -> Forced | None:
    """The call a chat or Messages request forces (OpenAI `required` or a named function, Anthropic `any`
    or a named `tool`), None when the model may answer with text; a BadRequest for a choice of a tool the
    request does not declare."""
    choice = doc.get("tool_choice")
    name: object = None
    if path == CHAT and choice == "required":
        pass
    elif path == CHAT and isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequest("Missing required parameter: 'tool_choice.function.name'.")
    elif path == MESSAGES and isinstance(choice, dict) and choice.get("type") == "any":
        pass
    elif path == MESSAGES and isinstance(choice, dict) and choice.get("type") == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest("tool_choice.name: Field required")
    else:
        return None
    tools = declared(path, doc) or {}
    if name is None:
        if not tools:
            raise BadRequest("tool_choice: a tool call is required, but the request declares no tools")
        return Forced(tools)
    if name not in tools:
        raise BadRequest(f"tool_choice: the tool {str(name)[:100]!r} is not one of the request's tools")
    return Forced({name: tools[name]})


def engine_request(
    daemon_forces: bool, path: str, doc: dict[str, Any], choice: Forced | None
) -> tuple[dict[str, Any], Tools | None]:
    """The request (whose forced call is `choice`) as the engine is to get it, and the tools whose calls
    written as text become calls. `daemon_forces`: the engine does not apply a forced choice itself
    (`Engine.ignores_forced_tool_choice`), so its chat request gets the daemon's grammar of the call."""
    if choice is None:
        return doc, declared(path, doc)
    if daemon_forces and path == CHAT:
        return choice.engine_request(doc), choice.tools
    return doc, choice.tools
