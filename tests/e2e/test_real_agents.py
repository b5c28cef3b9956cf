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

Then each agent once on the real llama-server, with the tiny random-weight model (which calls no tool: the
session's second turn is the agent's own "continue the last session" with a new prompt): both runs exit 0,
and the usage llama-server reported for turn 2 says at least 90 % of its prompt came from the cache. Turn 1
prefills the agent's whole first prompt (Claude Code's: ~47k of the tiny vocabulary's tokens, ~4 minutes on
two loaded cores), hence the longer bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.dmr_daemons import FakeDaemons, cli_env
from tests.daemon import Daemon, free_port
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf

AGENTS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "modelrunner" / "agents"
MODEL = "tiny"
# above every agent's first prompt in the tiny model's vocabulary, which spells it nearly a token a character
# (Claude Code 2.1.197's: ~85k tokens; ~12.6k in a real model's)
CONTEXT = 131072
SECRET = "the secret word is pelican"
PROMPT = "Read note.txt and tell me the secret word."
SESSION_TIMEOUT = 180  # seconds for a whole session, the agent killed (with its children) beyond it
LLAMA_TURN_TIMEOUT = 600  # one turn on llama-server (Claude Code abandons a request after 10 minutes)
# On llama-server the tiny model answers end-of-text at once (tests/models.py `ends_at_once`): a random
# model's noise ran until a cap, and Claude Code exits 1 on an answer its cap cut ("exceeded the 64 output
# token maximum"), Codex has no cap at all; an empty, complete answer is what every agent takes as a turn.
# Claude Code's ~20 tools, spelled by the tiny vocabulary, take 2.1.197's first prompt to ~85k tokens: more
# than its 10-minute request limit prefills on two loaded cores. On llama-server it keeps its Read tool only
# (the scripted sessions above send all of them).
LLAMA_TOOLS = {"claude": ("--tools", "Read")}


@dataclass(frozen=True)
class Agent:
    app: str  # as `model launch` names it
    package: str  # its prefix in AGENTS (scripts/test-setup)
    args: tuple[str, ...]  # headless: one prompt, the file-reading tool allowed
    tool: str  # the tool the scripted model calls, and its arguments (`{file}`: the note's absolute path)
    tool_args: str
    route: str  # where its requests arrive
    continued: tuple[str, ...]  # headless, its last session continued with a second prompt

    def binary(self) -> Path:
        return AGENTS / self.package / "node_modules" / ".bin" / self.app


CLAUDE_ARGS = ("-p", PROMPT, "--allowedTools", "Read")  # as root, --dangerously-skip-permissions is refused
CLAUDE_READ = '{"file_path": "{file}"}'
GO_ON = "Go on."
CLAUDE_GO_ON = ("-c", "-p", GO_ON)
AGENT_CASES = {
    "claude-2.1.332": Agent(
        "claude",
        "claude-code-2.1.332",
        CLAUDE_ARGS,
        "Read",
        CLAUDE_READ,
        "/anthropic/v1/messages",
        CLAUDE_GO_ON,
    ),
    "claude-2.1.197": Agent(
        "claude",
        "claude-code-2.1.197",
        CLAUDE_ARGS,
        "Read",
        CLAUDE_READ,
        "/anthropic/v1/messages",
        CLAUDE_GO_ON,
    ),
    # exec's default sandbox is read-only, which lets `cat` read the note
    "codex-0.171.0": Agent(
        "codex",
        "codex-0.171.0",
        ("exec", "--skip-git-repo-check", PROMPT),
        "exec_command",
        '{"cmd": "cat {file}"}',
        "/v1/responses",
        ("exec", "resume", "--last", "--skip-git-repo-check", GO_ON),
    ),
    "opencode-1.18.33": Agent(
        "opencode",
        "opencode-ai-1.18.33",
        ("run", PROMPT),
        "read",
        '{"filePath": "{file}"}',
        "/v1/chat/completions",
        ("run", "--continue", GO_ON),
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


def run_session(
    agent: Agent,
    url: str,
    tmp_path: Path,
    args: tuple[str, ...] | None = None,
    timeout: float = SESSION_TIMEOUT,
    **extra: str,
) -> subprocess.CompletedProcess[str]:
    """`model launch APP --model tiny -- ARGS` in the note's folder, the agent alone in a HOME of its own
    (its XDG folders under it), bounded: on timeout the session's process group is killed."""
    home, work = tmp_path / "user", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    env = cli_env(
        tmp_path,
        url,
        HOME=str(home),
        PATH=f"{installed(agent).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_CACHE_HOME=str(home / ".cache"),
        PWD=str(work),  # OpenCode takes its project folder from it, not from the working directory
        TERM="dumb",
        NO_COLOR="1",
        **extra,
    )
    words = agent.args if args is None else args
    command = [sys.executable, "-m", "modelrunner", "launch", agent.app, "--model", MODEL, "--", *words]
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
            stdout, stderr = session.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(session.pid, signal.SIGKILL)
            stdout, stderr = session.communicate()
            pytest.fail(f"{agent.app} did not end within {timeout} s\n{stdout[-2000:]}\n{stderr[-2000:]}")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(session.pid, signal.SIGKILL)  # whatever the agent left running
    return subprocess.CompletedProcess(command, session.returncode, stdout, stderr)


def recorded(daemon: Daemon | InProcessDaemon, since: int = 0) -> list[dict[str, Any]]:
    """The requests the recorder kept (the last few of each model), in the order they came; `since`: those
    that came after that time.time_ns()."""
    listing = daemon.http("GET", "/engines/requests").json()
    records = [record for model in listing for record in model["records"]]
    came = {record["id"]: int(record["id"].rsplit("_", 1)[1]) for record in records}
    return sorted((r for r in records if came[r["id"]] >= since), key=lambda record: came[record["id"]])


def as_rendered(value: Any) -> Any:
    """A prompt as a template sees it: Anthropic's `cache_control` marks left out (Claude Code moves its last
    mark to the newest message every turn, and no engine renders them) and a message's content as text
    blocks (Claude Code sends a system message's text as blocks, then as a string when it sends it again)."""
    if isinstance(value, dict):
        rendered = {k: as_rendered(v) for k, v in value.items() if k != "cache_control"}
        if "role" in value and isinstance(value.get("content"), str):
            rendered["content"] = [{"type": "text", "text": value["content"]}]
        return rendered
    if isinstance(value, list):
        return [as_rendered(item) for item in value]
    return value


def prompt_text(body: dict[str, Any]) -> str:
    """What the engine renders of a request, in its order: instructions, tools, then the conversation."""
    parts = [body.get(key) for key in ("system", "instructions", "tools")]
    turns = body.get("messages") or body.get("input") or []
    if isinstance(turns, str):
        turns = [turns]
    return "".join(json.dumps(as_rendered(part), sort_keys=True) for part in [*parts, *turns])


def unchanged_share(first: str, second: str) -> float:
    common = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(first))
    return min(common, len(second)) / len(second)


def assert_exited_0(
    name: str, session: subprocess.CompletedProcess[str], records: list[dict[str, Any]]
) -> None:
    refused = [f"{r['url']} {r['status_code']}: {r.get('error')}" for r in records if r["status_code"] >= 400]
    assert session.returncode == 0, (
        f"{name} exited {session.returncode}\nstdout: {session.stdout[-3000:]}\n"
        f"stderr: {session.stderr[-3000:]}\nrefused requests recorded: {refused}"
    )


def cached_share(answer: dict[str, Any]) -> float:
    """The share of a turn's prompt that the engine's cache served, from the usage of its answer (Messages:
    `input_tokens` is the uncached part; chat and Responses: the cached part of the whole)."""
    usage = answer["usage"]
    if "cache_read_input_tokens" in usage:
        cached = usage["cache_read_input_tokens"]
        whole = usage["input_tokens"] + cached + (usage.get("cache_creation_input_tokens") or 0)
    elif "prompt_tokens" in usage:
        cached, whole = usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]
    else:
        cached, whole = usage["input_tokens_details"]["cached_tokens"], usage["input_tokens"]
    return float(cached / whole)


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
    session = run_session(agent, daemon.url, tmp_path)
    records = recorded(daemon)
    assert_exited_0(name, session, records)
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


@pytest.fixture(scope="module")
def llama_daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    """The daemon on llama-server, the tiny model packaged with a window for the agents' prompts."""
    home = tmp_path_factory.mktemp("real-agents")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLAMA_SERVER_PATH", str(llama_server))
        running = Daemon(home / "home", free_port()).start()
    try:
        gguf = write_tiny_gguf(home / "tiny.gguf", context_length=CONTEXT, ends_at_once=True)
        packaged = running.cli("package", "--gguf", str(gguf), MODEL)
        assert packaged.returncode == 0, packaged.stderr
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("name", sorted(AGENT_CASES))
def test_a_real_agent_session_on_llama_server(name: str, llama_daemon: Daemon, tmp_path: Path) -> None:
    agent = AGENT_CASES[name]
    installed(agent)
    since = time.time_ns()
    took = []
    for args in (agent.args, agent.continued):
        args = (*args, *LLAMA_TOOLS.get(agent.app, ()))
        started = time.monotonic()
        session = run_session(agent, llama_daemon.url, tmp_path, args, LLAMA_TURN_TIMEOUT)
        took.append(time.monotonic() - started)
        assert_exited_0(name, session, recorded(llama_daemon, since))
    turns = main_turns(agent, recorded(llama_daemon, since))
    assert len(turns) >= 2, turns
    first, last = turns[0], turns[-1]
    assert GO_ON in last["request"] and GO_ON not in first["request"]
    share = cached_share(json.loads(last["response"]))
    usage = [json.loads(turn["response"])["usage"] for turn in (first, last)]
    print(
        f"{name}: turn 1 {took[0]:.0f} s, turn 2 {took[1]:.0f} s, turn 2 from the cache {share:.1%}; {usage}"
    )
    assert share >= 0.9, f"{name}: {share:.1%} of turn 2's prompt came from the cache; usage: {usage}"
