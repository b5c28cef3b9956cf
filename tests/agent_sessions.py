"""Replayed coding-agent sessions (issue 22 item 3): what Claude Code, Codex and OpenCode send, turn by turn,
through the official SDKs, and what each turn got back (prompt tokens, cached tokens, time to first token).

A session is a replay: the assistant's earlier tool calls and their results are scripted into the history, so
a turn's request does not depend on what the (random-weight, in tests) model answered before. Each request
itself is real. tests/integration/test_agent_sessions.py asserts on the turns; bench/agents.py prints them.
The shapes follow /work/shared/reference/agents.md: Claude Code streams Messages with a billing line (new
`cc_version` suffix and `cch` every request), `cache_control`, tools, `count_tokens` before main turns and
small side calls with another system prompt; Codex streams Responses with function tools, `function_call` /
`function_call_output` items and `previous_response_id`; OpenCode streams chat completions with tools.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai

from tests.agent_prompts import further_step, padded_system

MAIN, SIDE = "main", "side"


@dataclass(frozen=True)
class Turn:
    """One request of a session: `main` (the agent's loop) or `side` (a title or summary call)."""

    kind: str
    request: dict[str, Any]  # the SDK call's keyword arguments, without `model` and sampling
    chained: bool = False  # Responses: continue from the previous main turn's `previous_response_id`


@dataclass
class TurnResult:
    agent: str
    turn: int
    kind: str
    prompt_tokens: int  # the whole input, cached part included
    cached_tokens: int
    ttft_s: float  # to the first content event of the stream (its end when none came)
    events: int  # stream events the SDK parsed
    counted: int | None = None  # count_tokens before the turn (Claude Code's main turns)
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # assembled (name, arguments)
    response_id: str = ""


def billing(turn: int) -> dict[str, Any]:
    """Claude Code 2.1.17x's first system block: the version's 3-hex suffix and `cch` change per request."""
    digest = hashlib.sha256(f"request {turn}".encode()).hexdigest()
    line = (
        f"x-anthropic-billing-header: cc_version=2.1.177.{digest[:3]}; cc_entrypoint=cli; cch={digest[3:8]};"
    )
    return {"type": "text", "text": line}


# --- Claude Code: Messages ----------------------------------------------------------------------------------

CLAUDE_SYSTEM = "You are a coding agent. Use the tools to read, edit and test code. Be brief."
CLAUDE_SIDE_SYSTEM = "Write a title of at most five words for this chat."
CLAUDE_TOOLS: list[dict[str, Any]] = [
    {
        "name": "Read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "name": "Edit",
        "description": "Replace text in a file.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
            "required": ["path", "old", "new"],
        },
    },
    {
        "name": "Bash",
        "description": "Run a command.",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
]
# The scripted loop: (tool, input, result) per step, after the user's task.
STEPS: list[tuple[str, dict[str, str], str]] = [
    ("Read", {"path": "calc.py"}, "def add(a, b):\n    return a - b\n"),
    ("Edit", {"path": "calc.py", "old": "a - b", "new": "a + b"}, "edited"),
    ("Bash", {"cmd": "pytest -q"}, "1 passed"),
    ("Bash", {"cmd": "git diff --stat"}, "calc.py | 2 +-"),
]
TASK = "fix the add test"
CLAUDE_HEADERS = {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}


def scripted_step(step: int) -> tuple[str, dict[str, str], str]:
    """The loop's `step`-th (tool, input, result): STEPS, then tests/agent_prompts.py's further steps."""
    return STEPS[step] if step < len(STEPS) else further_step(step - len(STEPS))


def side_call_after(step: int) -> bool:
    """Claude Code's title and summary calls: after the first and the third main turn, then every fourth."""
    return step in (0, 2) or (step >= 6 and step % 4 == 2)


def claude_code(main_turns: int = len(STEPS) + 1, system_tokens: int = 0) -> list[Turn]:
    """`main_turns` main turns (five by default), each the history so far plus the user's last
    `tool_result`, with a side call after the first, the third, then every fourth (as Claude Code's title
    and summary calls). `system_tokens`: the system prompt padded with agent instructions to about that
    many tokens (tests/agent_prompts.py); 0 keeps the one-line prompt."""
    history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    turns: list[Turn] = []
    prompt = padded_system(CLAUDE_SYSTEM, system_tokens) if system_tokens else CLAUDE_SYSTEM
    for step in range(main_turns):
        system = [
            billing(len(turns)),
            {"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}},
        ]
        request = {
            "system": system,
            "messages": list(history),
            "tools": CLAUDE_TOOLS,
            "tool_choice": {"type": "auto"},
        }
        turns.append(Turn(MAIN, {**request, "metadata": {"user_id": "user_replay_session_1"}}))
        if step < main_turns - 1:
            if side_call_after(step):
                side = [billing(len(turns)), {"type": "text", "text": CLAUDE_SIDE_SYSTEM}]
                turns.append(Turn(SIDE, {"system": side, "messages": [{"role": "user", "content": TASK}]}))
            name, arguments, result = scripted_step(step)
            call_id = f"toolu_{step:02d}"
            use = {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
            history.append({"role": "assistant", "content": [use]})
            answer = {"type": "tool_result", "tool_use_id": call_id, "content": result}
            history.append({"role": "user", "content": [answer]})
    return turns


def run_claude_code(
    client: anthropic.Anthropic,
    model: str,
    max_tokens: int,
    main_turns: int = len(STEPS) + 1,
    system_tokens: int = 0,
) -> list[TurnResult]:
    """The session of `claude_code(main_turns, system_tokens)`, turn by turn."""
    results = []
    for number, turn in enumerate(claude_code(main_turns, system_tokens)):
        counted = None
        if turn.kind == MAIN:
            keys = ("system", "messages", "tools", "tool_choice")
            counting = {k: v for k, v in turn.request.items() if k in keys}
            counting["system"] = [billing(1000 + number), *counting["system"][1:]]  # its own fresh line
            counted = client.messages.count_tokens(
                model=model, **counting, extra_headers=CLAUDE_HEADERS
            ).input_tokens
        started, first, events = time.perf_counter(), 0.0, 0
        with client.messages.stream(
            model=model,
            max_tokens=max_tokens,
            extra_body={"temperature": 0, "top_k": 1},
            extra_headers=CLAUDE_HEADERS,
            **turn.request,
        ) as stream:
            for event in stream:
                events += 1
                if not first and event.type in ("content_block_start", "content_block_delta"):
                    first = time.perf_counter()
            message = stream.get_final_message()
        usage = message.usage
        cached = usage.cache_read_input_tokens or 0
        calls = [
            (block.name, json.dumps(block.input)) for block in message.content if block.type == "tool_use"
        ]
        results.append(
            TurnResult(
                agent="claude-code",
                turn=number,
                kind=turn.kind,
                prompt_tokens=usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0),
                cached_tokens=cached,
                ttft_s=(first or time.perf_counter()) - started,
                events=events,
                counted=counted,
                tool_calls=calls,
                response_id=message.id,
            )
        )
    return results


# --- Codex: Responses ---------------------------------------------------------------------------------------

CODEX_INSTRUCTIONS = "You are Codex, a coding agent in a terminal. Run commands with the shell tool."
CODEX_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            "required": ["command"],
        },
        "strict": False,
    },
]


def codex(steps: int = 3, system_tokens: int = 0) -> list[Turn]:
    """`steps` turns that each resend the whole input with one scripted `function_call` /
    `function_call_output` pair more (as Codex does without server-side storage), a turn with all of them,
    then one that continues with `previous_response_id` and only the new user message. `system_tokens`: the
    instructions padded as Claude Code's system prompt (tests/agent_prompts.py); 0 keeps the one line."""
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": TASK}]
    instructions = padded_system(CODEX_INSTRUCTIONS, system_tokens) if system_tokens else CODEX_INSTRUCTIONS
    common = {"instructions": instructions, "tools": CODEX_TOOLS, "tool_choice": "auto"}
    turns = []
    for step in range(steps):
        _, arguments, result = scripted_step(step)
        turns.append(
            Turn(MAIN, {**common, "input": list(items), "parallel_tool_calls": False, "store": True})
        )
        call_id = f"call_{step:02d}"
        command = ["bash", "-lc", " ".join(arguments.values())]
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "shell",
                "arguments": json.dumps({"command": command}),
            }
        )
        items.append({"type": "function_call_output", "call_id": call_id, "output": result})
    turns.append(Turn(MAIN, {**common, "input": list(items), "store": True}))
    follow_up = [{"type": "message", "role": "user", "content": "now run the tests again"}]
    turns.append(Turn(MAIN, {**common, "input": follow_up, "store": True}, chained=True))
    return turns


def run_codex(
    client: openai.OpenAI, model: str, max_tokens: int, steps: int = 3, system_tokens: int = 0
) -> list[TurnResult]:
    """The session of `codex(steps, system_tokens)`, turn by turn."""
    results: list[TurnResult] = []
    for number, turn in enumerate(codex(steps, system_tokens)):
        previous: dict[str, Any] = {"previous_response_id": results[-1].response_id} if turn.chained else {}
        started, first, events = time.perf_counter(), 0.0, 0
        final: Any = None
        stream = client.responses.create(
            model=model,
            max_output_tokens=max_tokens,
            temperature=0,
            stream=True,
            extra_body={"top_k": 1},
            **previous,
            **turn.request,
        )
        for event in stream:
            events += 1
            if not first and event.type in (
                "response.output_text.delta",
                "response.function_call_arguments.delta",
            ):
                first = time.perf_counter()
            if event.type in (
                "response.completed",
                "response.incomplete",
            ):  # incomplete: at max_output_tokens
                final = event.response
        assert final is not None and final.usage is not None, "no final response event with usage"
        calls = [(item.name, item.arguments) for item in final.output if item.type == "function_call"]
        results.append(
            TurnResult(
                agent="codex",
                turn=number,
                kind=turn.kind,
                prompt_tokens=final.usage.input_tokens,
                cached_tokens=final.usage.input_tokens_details.cached_tokens,
                ttft_s=(first or time.perf_counter()) - started,
                events=events,
                tool_calls=calls,
                response_id=final.id,
            )
        )
    return results


# --- OpenCode: chat completions -----------------------------------------------------------------------------

OPENCODE_SYSTEM = "You are opencode, an interactive CLI coding agent. Use the tools."
OPENCODE_TITLE_SYSTEM = "Generate a short title for the conversation."
OPENCODE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"filePath": {"type": "string"}},
                "required": ["filePath"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    # opencode's todoread takes no arguments: the turn that forces it streams a call short enough for any
    # model
    {
        "type": "function",
        "function": {
            "name": "todoread",
            "description": "Read the todo list.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def opencode() -> list[Turn]:
    """Four main turns with `tool_calls` and `tool` results in the history, a title call after the first;
    the last main turn forces `todoread`, so that its call streams as `tool_calls` deltas."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": OPENCODE_SYSTEM},
        {"role": "user", "content": TASK},
    ]
    turns = []
    names = {"Read": ("read", "filePath"), "Edit": ("bash", "command"), "Bash": ("bash", "command")}
    for step in range(4):
        choice: Any = "auto" if step < 3 else {"type": "function", "function": {"name": "todoread"}}
        turns.append(Turn(MAIN, {"messages": list(messages), "tools": OPENCODE_TOOLS, "tool_choice": choice}))
        if step == 0:
            title = [{"role": "system", "content": OPENCODE_TITLE_SYSTEM}, {"role": "user", "content": TASK}]
            turns.append(Turn(SIDE, {"messages": title}))
        tool, arguments, result = STEPS[step]
        name, key = names[tool]
        call = {
            "id": f"call_{step:02d}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps({key: " ".join(arguments.values())})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return turns


def assembled(deltas: Iterable[Any]) -> list[tuple[str, str]]:
    """Streamed `tool_calls` deltas joined by index into (name, arguments), as the AI SDK does."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        call = calls.setdefault(delta.index, ["", ""])
        if delta.function is not None:
            call[0] += delta.function.name or ""
            call[1] += delta.function.arguments or ""
    return [(name, arguments) for name, arguments in (calls[i] for i in sorted(calls))]


def run_opencode(client: openai.OpenAI, model: str, max_tokens: int) -> list[TurnResult]:
    results = []
    for number, turn in enumerate(opencode()):
        started, first, events = time.perf_counter(), 0.0, 0
        deltas: list[Any] = []
        usage: Any = None
        stream = client.chat.completions.create(
            model=model,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"top_k": 1},
            **turn.request,
        )
        for chunk in stream:
            events += 1
            usage = chunk.usage or usage
            for choice in chunk.choices:
                if not first and (choice.delta.content or choice.delta.tool_calls):
                    first = time.perf_counter()
                deltas += choice.delta.tool_calls or []
        assert usage is not None, "no usage chunk"
        details = usage.prompt_tokens_details
        results.append(
            TurnResult(
                agent="opencode",
                turn=number,
                kind=turn.kind,
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=(details.cached_tokens or 0) if details else 0,
                ttft_s=(first or time.perf_counter()) - started,
                events=events,
                tool_calls=assembled(deltas),
            )
        )
    return results
