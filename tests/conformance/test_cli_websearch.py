"""`model run --websearch` as DMR's: the `web_search` tool offered to the model, each call it makes answered
by Exa's MCP endpoint and fed back as a `tool` message, until the model answers. The model is the in-process
daemon's fake engine (tests/fake_engine.py) streaming a function call as llama-server streams one: the tiny
real model in these tests has random weights and calls no tools. Exa is a local stand-in serving its answer's
shape (server-sent events of a JSON-RPC result), reached through MODEL_RUNNER_WEBSEARCH_URL.

Follows: `cmd/cli/tools/websearch.go` (WebSearchTool.Schema, WebSearchTool.Execute),
`cmd/cli/desktop/desktop.go` (ChatWithMessagesContext: the tool loop, maxToolCallIterations,
isTemplateIncompatibleError), `cmd/cli/desktop/api.go` (Tool, ToolCall, OpenAIChatMessage),
`cmd/cli/commands/run.go` (getActiveTools, the `--websearch` flag).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from modelrunner.cli.websearch import ToolError, run_tool, web_search
from tests.conformance.dmr_daemons import FakeDaemons, cli_env, run_cli
from tests.daemon import free_port
from tests.inprocess import InProcessDaemon
from tests.terminal import Terminal

EXA_TEXT = "Title: Example News\nURL: https://example.com/news\nText: Something new happened today."
# WebSearchTool.Schema as Go marshals it (desktop.Tool, ToolFunction)
DMR_TOOL = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web for current information up to 8 results. Use this when you need "
        "up-to-date information that may not be in your training data.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The search query"}},
            "required": ["query"],
        },
    },
}


@dataclass
class ExaStandIn:
    """Exa's MCP endpoint: records each request; answers `status` with `body` (default: Exa's SSE answer)."""

    status: int = 200
    body: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                stand_in.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": json.loads(raw)}
                )
                result = {
                    "result": {"content": [{"type": "text", "text": EXA_TEXT}]},
                    "jsonrpc": "2.0",
                    "id": 1,
                }
                body = (stand_in.body or f"event: message\ndata: {json.dumps(result)}\n\n").encode()
                self.send_response(stand_in.status)
                self.send_header(
                    "Content-Type", "text/event-stream" if not stand_in.body else "application/json"
                )
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mcp"


@pytest.fixture
def exa(monkeypatch: pytest.MonkeyPatch) -> Iterator[ExaStandIn]:
    stand_in = ExaStandIn()
    monkeypatch.setenv("MODEL_RUNNER_WEBSEARCH_URL", stand_in.url)
    yield stand_in
    stand_in.server.shutdown()
    stand_in.server.server_close()


def _daemon(daemons: FakeDaemons, **fake: str) -> InProcessDaemon:
    """The in-process daemon whose fake engine calls web_search (FAKE_* settings as given); model `tiny`."""
    env = {
        "FAKE_CHUNKS": "3",
        "FAKE_TOOL_CALL": "web_search",
        "FAKE_EVENTS": str(daemons.tmp_path / "events"),
        **fake,
    }
    return daemons.start(env)


def _chat_bodies(tmp_path: Path) -> list[dict[str, Any]]:
    """The chat requests with tools the engine received, in order."""
    lines = (tmp_path / "events").read_text().splitlines()
    return [event["body"] for event in map(json.loads, lines) if event["event"] == "chat"]


def _cli(tmp_path: Path, daemon: InProcessDaemon, url: str) -> dict[str, str]:
    return cli_env(tmp_path, daemon.url, MODEL_RUNNER_WEBSEARCH_URL=url)


def test_one_shot_run_calls_the_tool_and_feeds_its_result_back(
    tmp_path: Path, fake_daemons: FakeDaemons, exa: ExaStandIn
) -> None:
    daemon = _daemon(fake_daemons)
    try:
        result = run_cli(_cli(tmp_path, daemon, exa.url), "run", "--websearch", "tiny", "what is new?")
    finally:
        daemon.stop()
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"found: {EXA_TEXT}\n"
    assert '[tool] calling web_search with args: {"query": "what is new?"}\n' in result.stderr
    [search] = exa.requests
    assert search["body"] == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "web_search_exa",
            "arguments": {"query": "what is new?", "numResults": 8, "type": "auto", "livecrawl": "fallback"},
        },
    }
    assert search["headers"]["Content-Type"] == "application/json"
    assert search["headers"]["Accept"] == "application/json, text/event-stream"
    first, second = _chat_bodies(tmp_path)
    assert first["tools"] == second["tools"] == [DMR_TOOL]
    assert first["stream"] is True and first["messages"] == [{"role": "user", "content": "what is new?"}]
    call = {
        "id": "call_0",
        "type": "function",
        "index": 0,
        "function": {"name": "web_search", "arguments": '{"query": "what is new?"}'},
    }
    assert second["messages"] == [
        {"role": "user", "content": "what is new?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "content": EXA_TEXT, "tool_call_id": "call_0"},
    ]


def test_a_one_shot_openaiurl_prompt_uses_the_tool_too(
    tmp_path: Path, fake_daemons: FakeDaemons, exa: ExaStandIn
) -> None:
    """Ours: DMR's one-shot `--openaiurl` path (ChatWithContext) drops the tools; here the flag holds."""
    daemon = _daemon(fake_daemons)
    try:
        env = _cli(tmp_path, daemon, exa.url)
        result = run_cli(env, "run", "--websearch", "--openaiurl", f"{daemon.url}/engines/v1", "tiny", "q")
    finally:
        daemon.stop()
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"found: {EXA_TEXT}\n" and len(exa.requests) == 1


def test_an_unreachable_provider_is_reported_to_the_model(tmp_path: Path, fake_daemons: FakeDaemons) -> None:
    """Offline, DMR's Execute fails and the loop hands the model `tool execution error: ...`; the run goes
    on."""
    daemon = _daemon(fake_daemons)
    closed = f"http://127.0.0.1:{free_port()}/mcp"
    try:
        result = run_cli(_cli(tmp_path, daemon, closed), "run", "--websearch", "tiny", "news?")
    finally:
        daemon.stop()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f'found: tool execution error: executing search: Post "{closed}": ')
    assert "Connection refused" in result.stdout
    assert '[tool] calling web_search with args: {"query": "news?"}' in result.stderr


def test_the_loop_stops_after_ten_rounds(tmp_path: Path, fake_daemons: FakeDaemons, exa: ExaStandIn) -> None:
    daemon = _daemon(fake_daemons, FAKE_TOOL_ROUNDS="100")
    try:
        result = run_cli(_cli(tmp_path, daemon, exa.url), "run", "--websearch", "tiny", "loop")
    finally:
        daemon.stop()
    assert result.returncode == 1
    assert "tool call loop exceeded 10 iterations" in result.stderr
    assert len(exa.requests) == 9  # the tenth round's calls are not run


def test_a_template_without_tools_gets_the_question_again_without_them(
    tmp_path: Path, fake_daemons: FakeDaemons, exa: ExaStandIn
) -> None:
    daemon = _daemon(fake_daemons, FAKE_TOOL_CALL="", FAKE_TOOLS_REJECT="1")
    try:
        result = run_cli(_cli(tmp_path, daemon, exa.url), "run", "--websearch", "tiny", "hi")
    finally:
        daemon.stop()
    assert result.returncode == 0, result.stderr
    assert result.stdout == "t0 t1 t2 \n"
    assert len(_chat_bodies(tmp_path)) == 1 and exa.requests == []


def test_interactive_chat_keeps_only_the_answers_in_its_history(
    tmp_path: Path, fake_daemons: FakeDaemons, exa: ExaStandIn
) -> None:
    daemon = _daemon(fake_daemons)
    try:
        env = _cli(tmp_path, daemon, exa.url) | {"TERM": "dumb"}
        term = Terminal(["run", "--websearch", "tiny"], env, tmp_path)
        term.expect("> ")
        term.send("first")
        assert "found: Title: Example News" in term.expect("> ")
        term.send("second")
        term.expect("> ")
        term.send("/bye")
        assert term.close() == 0
    finally:
        daemon.stop()
    answer = {"role": "assistant", "content": f"found: {EXA_TEXT}"}
    bodies = _chat_bodies(tmp_path)
    assert [b["messages"][:3] for b in bodies[2:3]] == [
        [{"role": "user", "content": "first"}, answer, {"role": "user", "content": "second"}]
    ]
    assert len(exa.requests) == 2


def test_execute_reads_json_or_events_and_words_failures_as_dmr(exa: ExaStandIn) -> None:
    assert web_search({"query": "q"}) == EXA_TEXT
    exa.body = json.dumps(
        {"result": {"content": [{"type": "text", "text": "plain"}]}, "jsonrpc": "2.0", "id": 1}
    )
    assert web_search({"query": "q"}) == "plain"
    exa.body = json.dumps({"result": {"content": []}, "jsonrpc": "2.0", "id": 1})
    assert web_search({"query": "q"}) == "No search results found."
    exa.status, exa.body = 503, "overloaded"
    with pytest.raises(ToolError, match=r"^search API returned status 503: overloaded$"):
        web_search({"query": "q"})
    for arguments in ({}, {"query": ""}, {"query": 3}):
        with pytest.raises(ToolError, match=r"^query parameter is required$"):
            web_search(arguments)
    tools: dict[str, Callable[[dict[str, Any]], str]] = {"web_search": web_search}
    assert run_tool(tools, "web_fetch", "{}") == "unknown tool: web_fetch"
    assert run_tool(tools, "web_search", "{").startswith("error parsing tool arguments: ")
    assert run_tool(tools, "web_search", "null") == "tool execution error: query parameter is required"
