"""The real coding agents, from npm and unmodified (issue 34): Claude Code 2.1.332 and 2.1.197, Codex CLI
0.171.0 and OpenCode 1.18.33, as scripts/test-setup installs them in the machine's cache, each driven headless
through `model launch --model M` (no hand-written config) in a HOME of its own, against a daemon whose engine
is scripted (tests/fake_engine.py): a two-turn session. Turn 1 the model calls the agent's file-reading tool
on a file the test wrote, the agent runs the tool itself; turn 2 the model answers with what the tool
returned (`found: ...`), which the agent prints before it exits 0.

What each agent sent is read from the daemon's request recorder: the tool's output (which only the agent could
have read) in turn 2's request, and turn 2's prompt extending turn 1's: the system prompt, the tools and turn
1's messages unchanged, so an engine's prompt cache serves them (the scripted engine keeps no cache; the share
asserted here is the prompt's unchanged prefix, what a cache can serve at most).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.dmr_daemons import FakeDaemons, cli_env
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf

AGENTS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "modelrunner" / "agents"
MODEL = "tiny"
CONTEXT = 65536  # above every agent's first prompt (Claude Code's ~12.6k tokens) and its refusal limits
SECRET = "the secret word is pelican"
PROMPT = "Read note.txt and tell me the secret word."
SESSION_TIMEOUT = 180  # seconds for a whole session, the agent killed (with its children) beyond it


@dataclass(frozen=True)
class Agent:
    app: str  # as `model launch` names it
    package: str  # its prefix in AGENTS (scripts/test-setup)
    args: tuple[str, ...]  # headless: one prompt, the file-reading tool allowed
    tool: str  # the tool the scripted model calls, and its arguments (`{file}`: the note's absolute path)
    tool_args: str
    route: str  # where its requests arrive

    def binary(self) -> Path:
        return AGENTS / self.package / "node_modules" / ".bin" / self.app


CLAUDE_ARGS = ("-p", PROMPT, "--allowedTools", "Read")  # as root, --dangerously-skip-permissions is refused
CLAUDE_READ = '{"file_path": "{file}"}'
AGENT_CASES = {
    "claude-2.1.332": Agent(
        "claude", "claude-code-2.1.332", CLAUDE_ARGS, "Read", CLAUDE_READ, "/anthropic/v1/messages"
    ),
    "claude-2.1.197": Agent(
        "claude", "claude-code-2.1.197", CLAUDE_ARGS, "Read", CLAUDE_READ, "/anthropic/v1/messages"
    ),
    # exec's default sandbox is read-only, which lets `cat` read the note
    "codex-0.171.0": Agent(
        "codex",
        "codex-0.171.0",
        ("exec", "--skip-git-repo-check", PROMPT),
        "exec_command",
        '{"cmd": "cat {file}"}',
        "/v1/responses",
    ),
    "opencode-1.18.33": Agent(
        "opencode",
        "opencode-ai-1.18.33",
        ("run", PROMPT),
        "read",
        '{"filePath": "{file}"}',
        "/v1/chat/completions",
    ),
}


def installed(agent: Agent) -> Path:
    binary = agent.binary()
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run scripts/test-setup (it installs the pinned agents from npm)")
    return binary


def agent_daemon(fake_daemons: FakeDaemons, agent: Agent, note: Path) -> InProcessDaemon:
    """A daemon whose scripted engine calls `agent.tool` on `note` once, then answers with its result; the
    tiny model packaged with a window that takes the agents' prompts."""
    arguments = agent.tool_args.replace("{file}", str(note))
    daemon = fake_daemons.start({"FAKE_TOOL_CALL": agent.tool, "FAKE_TOOL_ARGS": arguments}, models=())
    gguf = write_tiny_gguf(fake_daemons.tmp_path / "tiny.gguf", context_length=CONTEXT)
    packaged = daemon.http("POST", "/models/package", json={"target": MODEL, "gguf": str(gguf)})
    assert packaged.status_code == 201, packaged.text
    return daemon


def run_session(agent: Agent, daemon: InProcessDaemon, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`model launch APP --model tiny -- ARGS` in the note's folder, the agent alone in a HOME of its own
    (its XDG folders under it), bounded: on timeout the session's process group is killed."""
    home, work = tmp_path / "user", tmp_path / "work"
    home.mkdir()
    env = cli_env(
        tmp_path,
        daemon.url,
        HOME=str(home),
        PATH=f"{installed(agent).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_CACHE_HOME=str(home / ".cache"),
        PWD=str(work),  # OpenCode takes its project folder from it, not from the working directory
        TERM="dumb",
        NO_COLOR="1",
    )
    command = [sys.executable, "-m", "modelrunner", "launch", agent.app, "--model", MODEL, "--", *agent.args]
    with subprocess.Popen(
        command,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as session:
        try:
            stdout, stderr = session.communicate(timeout=SESSION_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(session.pid, signal.SIGKILL)
            stdout, stderr = session.communicate()
            pytest.fail(
                f"{agent.app} did not finish in {SESSION_TIMEOUT} s\n{stdout[-2000:]}\n{stderr[-2000:]}"
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(session.pid, signal.SIGKILL)  # whatever the agent left running
    return subprocess.CompletedProcess(command, session.returncode, stdout, stderr)


def recorded(daemon: InProcessDaemon) -> list[dict[str, Any]]:
    """Every request the recorder kept, in the order they came."""
    listing = daemon.http("GET", "/engines/requests").json()
    records = [record for model in listing for record in model["records"]]
    return sorted(records, key=lambda record: int(record["id"].rsplit("_", 1)[1]))


def without_cache_marks(value: Any) -> Any:
    """A prompt with Anthropic's `cache_control` marks left out: Claude Code moves its last mark to the
    newest message every turn, which no engine's prompt renders."""
    if isinstance(value, dict):
        return {k: without_cache_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_cache_marks(item) for item in value]
    return value


def prompt_text(body: dict[str, Any]) -> str:
    """What the engine renders of a request, in its order: instructions, tools, then the conversation."""
    parts = [body.get(key) for key in ("system", "instructions", "tools")]
    turns = body.get("messages") or body.get("input") or []
    if isinstance(turns, str):
        turns = [turns]
    return "".join(json.dumps(without_cache_marks(part)) for part in [*parts, *turns])


def unchanged_share(first: str, second: str) -> float:
    common = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(first))
    return min(common, len(second)) / len(second)


def main_turns(agent: Agent, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's main-loop requests (its route, with tools), their bodies parsed."""
    turns = []
    for record in records:
        if record["url"] != agent.route:
            continue
        body = json.loads(record["request"])
        if body.get("tools"):
            turns.append({**record, "body": body})
    return turns


@pytest.mark.parametrize("name", sorted(AGENT_CASES))
def test_a_real_agent_completes_a_two_turn_session(
    name: str, fake_daemons: FakeDaemons, tmp_path: Path
) -> None:
    agent = AGENT_CASES[name]
    installed(agent)
    (tmp_path / "work").mkdir()
    note = tmp_path / "work" / "note.txt"
    note.write_text(SECRET + "\n")
    daemon = agent_daemon(fake_daemons, agent, note)
    session = run_session(agent, daemon, tmp_path)
    records = recorded(daemon)
    refused = [
        f"{r['url']} {r['status_code']}: {r.get('error', '')}" for r in records if r["status_code"] >= 400
    ]
    assert session.returncode == 0, (
        f"{name} exited {session.returncode}\nstdout: {session.stdout[-3000:]}\n"
        f"stderr: {session.stderr[-3000:]}\nrefused requests recorded: {refused}"
    )
    assert SECRET in session.stdout  # the answer, quoting the tool's output, reached the agent
    turns = main_turns(agent, records)
    assert len(turns) >= 2, [(r["url"], r["status_code"]) for r in records]
    first, second = turns[0], turns[1]
    assert (first["status_code"], second["status_code"]) == (200, 200)
    assert agent.tool in first["response"]  # turn 1: the scripted model called the tool
    assert SECRET not in first["request"]
    assert SECRET in second["request"]  # turn 2: the agent ran the tool and sent its output back
    assert "found: " in second["response"]
    share = unchanged_share(prompt_text(first["body"]), prompt_text(second["body"]))
    assert share >= 0.9, f"turn 2's prompt keeps only {share:.1%} of turn 1's unchanged"
