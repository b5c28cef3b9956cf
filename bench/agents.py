"""Replayed agent sessions (issue 22 item 3): Claude Code (Messages, `anthropic`), Codex (Responses, `openai`)
and OpenCode (chat completions, `openai`) as tests/agent_sessions.py defines them, through the daemon on
llama-server with the embedded SmolLM2-135M. SmolLM2's own template renders no tools, so it is packaged with
the tests' ChatML template that does (SmolLM2 speaks ChatML). Prints per turn the prompt tokens, the cached
tokens and the time to first token (to the first content event of the stream; the end where none came), and
writes JSON.

    .venv/bin/python bench/agents.py [--max-tokens 16] [--out bench/results/agents.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import anthropic
import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelrunner.embedded import smollm2_gguf  # noqa: E402
from modelrunner.engines import build  # noqa: E402
from tests.agent_sessions import TurnResult, run_claude_code, run_codex, run_opencode  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import CHAT_TEMPLATE  # noqa: E402

MODEL = "smollm2-agents"


def report(turns: list[TurnResult]) -> None:
    for turn in turns:
        print(
            f"{turn.agent:>11} {turn.turn:>2} {turn.kind:>4} | prompt {turn.prompt_tokens:>5} | cached "
            f"{turn.cached_tokens:>5} | TTFT {turn.ttft_s * 1000:7.1f} ms | {turn.events:>3} events",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "agents.json")
    args = parser.parse_args()
    if "LLAMA_SERVER_PATH" not in os.environ:  # the installer's cached build, as the tests use
        os.environ["LLAMA_SERVER_PATH"] = str(build.ensure_built(build.BuildSpec("none"), print))
    home = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    template = home / "chatml-tools.jinja"
    template.write_text(CHAT_TEMPLATE)
    daemon = Daemon(home / "home", free_port()).start()
    turns: list[TurnResult] = []
    try:
        daemon.cli("package", "--gguf", str(smollm2_gguf()), "--chat-template", str(template), MODEL)
        messages = anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)
        oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
        for session in (
            run_claude_code(messages, MODEL, args.max_tokens),
            run_codex(oai, MODEL, args.max_tokens),
            run_opencode(oai, MODEL, args.max_tokens),
        ):
            report(session)
            turns += session
    finally:
        daemon.stop()
        shutil.rmtree(home, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(turn) for turn in turns], indent=2) + "\n")


if __name__ == "__main__":
    main()
