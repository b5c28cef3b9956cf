"""The interactive turn first (issue 39): an agent's main turn (its system prompt and tools, ~--system-tokens,
streamed) with the side requests agents send at the same moment (a title and a summary: no tools, ~300
tokens each, unstreamed) against the main turn alone; the main turn's time to its first token, through
the daemon on llama-server with SmolLM2-135M (Q4_1, the tests' ChatML template that renders tools). Two
daemons: one as shipped (side requests wait for the interactive turn: MODEL_RUNNER_SIDE_WAIT 30) and one
with MODEL_RUNNER_SIDE_WAIT=0 (they go at once, as before). Every main turn starts with a nonce of its own
(nothing cached); rounds alternate the order. Aim: the main turn with side requests <= 1.1x alone.

    .venv/bin/python bench/side_requests.py [--rounds 2] [--system-tokens 3000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.llama_servers import server_binary  # noqa: E402
from bench.new_session import TOOLS  # noqa: E402

from modelrunner.embedded import smollm2_gguf  # noqa: E402
from tests.agent_prompts import padded_system  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import CHAT_TEMPLATE  # noqa: E402

CHAT = "/engines/v1/chat/completions"
SIDES = ["Write a five-word title for a conversation about", "Summarise in one line a conversation about"]


def main_turn(daemon: Daemon, system: str) -> float:
    """Seconds to the main turn's first streamed token."""
    body = {
        "model": "smol",
        "messages": [
            {"role": "system", "content": f"{uuid.uuid4().hex}\n{system}"},
            {"role": "user", "content": "List the files of the project."},
        ],
        "tools": TOOLS,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }
    started = time.monotonic()
    with httpx.stream("POST", daemon.url + CHAT, json=body, timeout=900) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {") and '"choices":[{' in line.replace(" ", ""):
                return time.monotonic() - started
    raise RuntimeError("the main turn sent no token")


def side(daemon: Daemon, text: str) -> None:
    topic = " ".join(f"module_{i} does step {i}" for i in range(40))  # ~300 tokens
    body = {"model": "smol", "messages": [{"role": "user", "content": f"{text} {uuid.uuid4().hex} {topic}"}]}
    daemon.http("POST", CHAT, json={**body, "max_tokens": 16}, timeout=900).raise_for_status()


def with_sides(daemon: Daemon, system: str) -> float:
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        main = pool.submit(main_turn, daemon, system)
        time.sleep(0.05)  # the main turn first, its side requests at once after it
        sides = [pool.submit(side, daemon, text) for text in SIDES]
        ttft = main.result()
        for done in sides:
            done.result()
    return ttft


def started(work: Path, name: str, side_wait: str) -> Daemon:
    os.environ["MODEL_RUNNER_SIDE_WAIT"] = side_wait
    daemon = Daemon(work / name, free_port()).start()
    template = work / "chatml.jinja"
    template.write_text(CHAT_TEMPLATE)
    daemon.cli("package", "--gguf", str(smollm2_gguf()), "--chat-template", str(template), "smol")
    daemon.http(
        "POST", CHAT, json={"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    )
    return daemon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--system-tokens", type=int, default=3000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ["LLAMA_SERVER_PATH"] = str(server_binary())
    system = padded_system("You are a coding agent working in the user's project.", args.system_tokens)
    runs: dict[str, list[float]] = {
        "alone": [],
        "with sides, waiting (shipped)": [],
        "with sides, at once": [],
    }
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        shipped, at_once = started(work, "shipped", "30"), started(work, "at-once", "0")
        try:
            cases: list[tuple[str, Any]] = [
                ("alone", lambda: main_turn(shipped, system)),
                ("with sides, waiting (shipped)", lambda: with_sides(shipped, system)),
                ("with sides, at once", lambda: with_sides(at_once, system)),
            ]
            for round_ in range(args.rounds):
                for name, run in cases if round_ % 2 == 0 else cases[::-1]:
                    runs[name].append(run())
                    print(f"round {round_} {name:30}: main turn's first token after {runs[name][-1]:6.2f} s")
        finally:
            shipped.stop()
            at_once.stop()
    alone = statistics.median(runs["alone"])
    summary = {
        name: {"ttft_median": statistics.median(v), "ratio": statistics.median(v) / alone}
        for name, v in runs.items()
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": {"rounds": args.rounds, "system_tokens": args.system_tokens},
                    "runs": runs,
                    "summary": summary,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
