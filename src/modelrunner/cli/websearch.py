"""`model run --websearch`: DMR's web search tool and the tool loop of its chat client.

The tool (`cmd/cli/tools/websearch.go` WebSearchTool) is `web_search(query)`, answered by Exa's MCP endpoint
(a JSON-RPC `tools/call` of `web_search_exa`; MODEL_RUNNER_WEBSEARCH_URL overrides its address). The loop
(`cmd/cli/desktop/desktop.go` ChatWithMessagesContext) sends the tool with each request; when the model ends
a turn with `tool_calls`, each call is run, announced on stderr, and its result (or its error, in words the
model reads: this is how an unreachable provider is reported) goes back as a `tool` message, at most nine
rounds. A model whose chat template rejects tools is asked again without them. Only the final answer's text
is returned (the conversation history keeps no tool messages, as in DMR).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from modelrunner.errors import DaemonError

if TYPE_CHECKING:
    from modelrunner.client import Client

PROVIDER_URL_ENV = "MODEL_RUNNER_WEBSEARCH_URL"
EXA_MCP_URL = "https://mcp.exa.ai/mcp"
SEARCH_TIMEOUT = 25.0
DEFAULT_NUM_RESULTS = 8
MAX_TOOL_CALL_ITERATIONS = 10
TOOL_NAME = "web_search"
SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": f"Search the web for current information up to {DEFAULT_NUM_RESULTS} results. Use "
        "this when you need up-to-date information that may not be in your training data.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The search query"}},
            "required": ["query"],
        },
    },
}


class ToolError(Exception):
    """A tool that could not give a result; the model is told `tool execution error: <this>`."""


def provider_url() -> str:
    return os.environ.get(PROVIDER_URL_ENV) or EXA_MCP_URL


def web_search(arguments: dict[str, Any]) -> str:
    """WebSearchTool.Execute: the first text of the MCP answer (plain JSON or server-sent events)."""
    import httpx

    query = arguments.get("query")
    if not isinstance(query, str) or not query:
        raise ToolError("query parameter is required")
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "web_search_exa",
            "arguments": {
                "query": query,
                "numResults": DEFAULT_NUM_RESULTS,
                "type": "auto",
                "livecrawl": "fallback",
            },
        },
    }
    url = provider_url()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    try:
        response = httpx.post(url, content=json.dumps(request), headers=headers, timeout=SEARCH_TIMEOUT)
    except httpx.HTTPError as exc:
        raise ToolError(f'executing search: Post "{url}": {exc or exc.__class__.__name__}') from None
    if response.status_code != 200:
        raise ToolError(f"search API returned status {response.status_code}: {response.text}")
    return _first_text(response.text)


def _first_text(body: str) -> str:
    data = [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]
    text = "\n".join(data) if data else body
    try:
        answer = json.loads(text)
    except ValueError as exc:
        raise ToolError(f"parsing response: {exc}") from None
    result = answer.get("result") if isinstance(answer, dict) else None
    content = result.get("content") if isinstance(result, dict) else None
    if isinstance(content, list) and content:
        first = content[0]
        return str(first.get("text") or "") if isinstance(first, dict) else ""
    return "No search results found."


TOOLS: dict[str, Callable[[dict[str, Any]], str]] = {TOOL_NAME: web_search}


def run_tool(tools: dict[str, Callable[[dict[str, Any]], str]], name: str, arguments: str) -> str:
    """The `tool` message's content for one call, worded as DMR words each failure."""
    tool = tools.get(name)
    if tool is None:
        return f"unknown tool: {name}"
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        return f"error parsing tool arguments: {exc}"
    if parsed is not None and not isinstance(parsed, dict):
        return f"error parsing tool arguments: expected a JSON object, got {type(parsed).__name__}"
    print(f"[tool] calling {name} with args: {arguments}", file=sys.stderr, flush=True)
    try:
        return tool(parsed or {})
    except ToolError as exc:
        return f"tool execution error: {exc}"


class _Turn:
    """What one streamed answer asked for: its tool calls, assembled from their fragments by index."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, str]] = {}
        self.finish_reason = ""

    def observe(self, event: dict[str, Any]) -> None:
        for choice in (event.get("choices") or [])[:1]:
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or choice.get("message") or {}
            for fragment in delta.get("tool_calls") or []:
                call = self.calls.setdefault(
                    fragment.get("index") or 0, {"id": "", "name": "", "arguments": ""}
                )
                function = fragment.get("function") or {}
                call["id"] = fragment.get("id") or call["id"]
                call["name"] = function.get("name") or call["name"]
                call["arguments"] += function.get("arguments") or ""

    def ordered_calls(self) -> list[dict[str, str]]:
        """Indices 0, 1, ... up to the first gap, as DMR walks them."""
        return [self.calls[i] for i in range(len(self.calls)) if i in self.calls]


def _go_tool_call(call: dict[str, str]) -> dict[str, Any]:
    """desktop.ToolCall as Go marshals it: empty strings left out, `index` always there (and 0)."""
    out: dict[str, Any] = {"id": call["id"]} if call["id"] else {}
    function = {key: call[key] for key in ("name", "arguments") if call[key]}
    return {**out, "type": "function", "index": 0, "function": function}


def _template_incompatible(exc: DaemonError) -> bool:
    """isTemplateIncompatibleError: an engine whose chat template cannot take tools says Jinja or template."""
    text = exc.message.lower()
    return exc.status_code >= 400 and ("jinja" in text or "template" in text)


def answer_with_tools(
    daemon: Client,
    model: str,
    messages: list[dict[str, Any]],
    backend: str | None,
    color: bool = False,
    **options: Any,
) -> str:
    """stream_answer with the tools offered, run until the model answers without calling one."""
    from modelrunner.cli.answer import stream_answer

    history = list(messages)
    tools: list[dict[str, Any]] | None = [SCHEMA]
    rounds = 0
    while True:
        turn = _Turn()
        request = {"tools": tools, **options} if tools else options
        try:
            answer = stream_answer(daemon, model, history, backend, color, on_event=turn.observe, **request)
        except DaemonError as exc:
            if tools and _template_incompatible(exc):
                tools, history = None, list(messages)  # answer from what the model knows
                continue
            raise
        calls = turn.ordered_calls()
        if turn.finish_reason != "tool_calls" or not turn.calls:
            return answer
        rounds += 1
        if rounds >= MAX_TOOL_CALL_ITERATIONS:
            raise DaemonError(0, f"tool call loop exceeded {MAX_TOOL_CALL_ITERATIONS} iterations")
        history.append({"role": "assistant", "tool_calls": [_go_tool_call(call) for call in calls]})
        for call in calls:
            result = run_tool(TOOLS if tools else {}, call["name"], call["arguments"])
            reply: dict[str, Any] = {"role": "tool", "content": result}
            history.append({**reply, "tool_call_id": call["id"]} if call["id"] else reply)


def answerer(websearch: bool) -> Callable[..., str]:
    """The function that answers a `run` prompt: with the web search tool when asked for."""
    if websearch:
        return answer_with_tools
    from modelrunner.cli.answer import stream_answer

    return stream_answer
