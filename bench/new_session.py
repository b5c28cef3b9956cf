"""A new session starts warm (issue 39): an agent's fixed prefix (its system prompt and tool definitions, the
same from one session to the next) comes from the cache in the next session's first turn: right after the
previous session, after `model unload`, and after the daemon restarts (warm resume saves the slots before
the engine stops and restores them at the next load). Through the daemon on llama-server with SmolLM2-135M
(Q4_1, packaged with the tests' ChatML template that renders tools): each session's first turn is the same
system prompt and tools (~--system-tokens) with a user message of its own, greedy, max_tokens 1, timed to
its answer (its prefill: the time to first token); its usage says how much of the prompt was cached.
Ratios against the cold first turn of the run.

    .venv/bin/python bench/new_session.py [--system-tokens 3000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.llama_servers import server_binary  # noqa: E402

from modelrunner.embedded import smollm2_gguf  # noqa: E402
from tests.agent_prompts import padded_system  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import CHAT_TEMPLATE  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} a file of the project",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read", "write", "edit", "list", "search", "run")
]


def first_turn(daemon: Daemon, system: str, task: str) -> dict[str, Any]:
    body = {
        "model": "smol",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": task}],
        "tools": TOOLS,
        "max_tokens": 1,
        "temperature": 0,
    }
    started = time.monotonic()
    answer = daemon.http("POST", "/engines/v1/chat/completions", json=body, timeout=900)
    answer.raise_for_status()
    usage = answer.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"seconds": time.monotonic() - started, "prompt": usage["prompt_tokens"], "cached": cached}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system-tokens", type=int, default=3000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ["LLAMA_SERVER_PATH"] = str(server_binary())
    system = padded_system("You are a coding agent working in the user's project.", args.system_tokens)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as work:
        home = Path(work) / "home"
        template = Path(work) / "chatml.jinja"
        template.write_text(CHAT_TEMPLATE)
        port = free_port()
        daemon = Daemon(home, port).start()
        try:
            daemon.cli("package", "--gguf", str(smollm2_gguf()), "--chat-template", str(template), "smol")
            results["cold"] = first_turn(daemon, system, "Session 1: list the files.")
            results["next session"] = first_turn(daemon, system, "Session 2: read README.md.")
            daemon.cli("unload", "smol")
            results["after unload"] = first_turn(daemon, system, "Session 3: run the tests.")
        finally:
            daemon.stop()  # the runner's slots are saved as it stops
        daemon = Daemon(home, port).start()
        try:
            results["after restart"] = first_turn(daemon, system, "Session 4: edit main.py.")
        finally:
            daemon.stop()
    cold = results["cold"]["seconds"]
    for name, result in results.items():
        result["cached_share"] = result["cached"] / result["prompt"]
        result["ttft_ratio"] = result["seconds"] / cold
        print(
            f"{name:14}: {result['seconds']:6.2f} s ({result['ttft_ratio']:.2f}x cold), cached "
            f"{result['cached']} of {result['prompt']} prompt tokens ({result['cached_share']:.0%})"
        )
    if args.out:
        args.out.write_text(
            json.dumps({"args": {"system_tokens": args.system_tokens}, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
