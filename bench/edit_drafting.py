"""Draftless n-gram speculative decoding on an edit turn (issue 39): a model asked to rewrite a 187-line
Python file whole with one small change copies most of its answer from its prompt, which llama.cpp's
n-gram drafts (b11434 `--spec-type ngram-simple`, `ngram-mod`, `ngram-map-k`) can propose for the
model to verify in one batch. Against the same server without drafting (the baseline command line of
bench/llama_servers.py), greedy: generation tokens/s (the answer's `timings`), the drafts accepted
(`draft_n_accepted` / `draft_n`), whether the answer is byte-identical to the undrafted one of the same
round, and whether it is the expected file. A normal chat answer (nothing to copy) shows what drafting
costs where it does not pay. Every configuration runs in its own llama-server at once; the rounds alternate
between them, each in the reverse order of the last; ratios are to the undrafted median of the same run.

The file is src/modelrunner/client_types.py as of commit b8690de (pinned: the source moves on).

    .venv/bin/python bench/edit_drafting.py [--model gemma|smollm2] [--rounds 2]
        [--max-tokens 4096] [--configs none,ngram-mod,...] [--out bench/results/edit_drafting-MODEL.json]
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.llama_servers import ROOT, Server, gemma, servers, smollm2

PINNED = "b8690de"
FILE = "src/modelrunner/client_types.py"
CONFIGS: dict[str, list[str]] = {
    "none": [],
    "ngram-simple": ["--spec-type", "ngram-simple"],  # lookup 12 tokens, draft up to 48
    "ngram-simple n6 m24": [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "6", "--spec-ngram-simple-size-m", "24"
    ],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],  # lookup 12, draft up to 48
    "ngram-mod": ["--spec-type", "ngram-mod"],  # match 24, draft 48-64
    "ngram-mod match12 8-32": [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "12",
        "--spec-ngram-mod-n-min", "8", "--spec-ngram-mod-n-max", "32",
    ],
}  # fmt: skip
TRAINED = {"gemma": 32768, "smollm2": 8192}
GEMMA_TEMPLATE = ROOT / "src" / "modelrunner" / "templates" / "gemma3.jinja"
FENCE = re.compile(r"```(?:python)?\n(.*?)(?:```|\Z)", re.S)


def edit_turn() -> tuple[list[dict[str, str]], str]:
    """The edit's messages, and the file the edit should give."""
    source = subprocess.run(
        ["git", "show", f"{PINNED}:{FILE}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    ask = (
        f"Here is `{Path(FILE).name}`:\n\n```python\n{source}```\n\nRename the function `_int` to `_as_int`"
        " everywhere in this file. Reply with the whole updated file in one ```python block and nothing else."
    )
    messages = [{"role": "system", "content": "You are a careful coding assistant."}]
    return [*messages, {"role": "user", "content": ask}], re.sub(r"\b_int\b", "_as_int", source)


CHAT = [{"role": "user", "content": "Explain in about 200 words why the sky is blue and sunsets are red."}]


def run(server: Server, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "cache_prompt": False}
    started = time.perf_counter()
    answer = server.chat(body)
    t = answer["timings"]
    return {
        "predicted_n": t["predicted_n"],
        "gen_tps": t["predicted_n"] / t["predicted_ms"] * 1e3,
        "wall_s": round(time.perf_counter() - started, 2),
        "draft_n": t.get("draft_n", 0),
        "draft_accepted": t.get("draft_n_accepted", 0),
        "finish": answer["choices"][0]["finish_reason"],
        "content": answer["choices"][0]["message"]["content"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["gemma", "smollm2"], default="gemma")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096, help="of the edit's answer (the file: ~1.8k)")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or Path(f"bench/results/edit_drafting-{args.model}.json")
    names = args.configs.split(",")
    work = Path(tempfile.mkdtemp(prefix="edit-drafting-"))
    model = gemma(work) if args.model == "gemma" else smollm2()
    edit, expected = edit_turn()
    turns = {"edit": (edit, args.max_tokens), "chat": (CHAT, 300)}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    started = time.monotonic()
    trained = TRAINED[args.model]
    # the GGUF's own template is ChatML, which Gemma answers with noise: the daemon gives it modelrunner's
    own = ["--chat-template-file", str(GEMMA_TEMPLATE)] if args.model == "gemma" else []
    with servers({n: [*own, *CONFIGS[n]] for n in names}, model, trained, trained, work) as running:
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else list(reversed(names))
            for turn, (messages, max_tokens) in turns.items():
                for name in order:
                    got = run(running[name], messages, max_tokens)
                    got["round"] = round_
                    results.setdefault(turn, {}).setdefault(name, []).append(got)
                    print(
                        f"r{round_} {turn:<5} {name:<24} {got['predicted_n']:>5} {got['gen_tps']:>6.1f} tok/s"
                        f" drafts {got['draft_accepted']}/{got['draft_n']} {got['finish']}",
                        flush=True,
                    )
    summary: dict[str, Any] = {}
    print("\n| turn | drafting | flags | tokens | gen tok/s | ratio | accepted | same as none | edit right |")
    print("|---|---|---|---|---|---|---|---|---|")
    for turn, by_name in results.items():
        base = statistics.median(r["gen_tps"] for r in by_name["none"])
        for name, runs in by_name.items():
            tps = statistics.median(r["gen_tps"] for r in runs)
            drafted = sum(r["draft_n"] for r in runs)
            accepted = sum(r["draft_accepted"] for r in runs) / drafted if drafted else None
            same = all(
                r["content"] == b["content"]
                for r in runs
                for b in by_name["none"]
                if b["round"] == r["round"]
            )
            code = FENCE.search(runs[0]["content"])
            got_file = code[1] if code else runs[0]["content"]
            similar = difflib.SequenceMatcher(None, got_file, expected, autojunk=False).ratio()
            row = {
                "tokens": runs[0]["predicted_n"],
                "gen_tps": round(tps, 1),
                "ratio": round(tps / base, 3),
                "runs": [round(r["gen_tps"], 1) for r in runs],
                "accepted": None if accepted is None else round(accepted, 3),
                "byte_identical_to_none": same,
                "exact_edit": got_file == expected if turn == "edit" else None,
                "similarity_to_expected": round(similar, 3) if turn == "edit" else None,
            }
            summary.setdefault(turn, {})[name] = row
            rate = "-" if accepted is None else f"{accepted:.0%}"
            right = f"{row['exact_edit']} ({similar:.0%} alike)" if turn == "edit" else "-"
            print(
                f"| {turn} | {name} | `{' '.join(CONFIGS[name]) or '(none)'}` | {row['tokens']} | {tps:.1f} |"
                f" {tps / base:.2f} | {rate} | {'yes' if same else 'NO'} | {right} |"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "model": model.name,
        "file": f"{FILE}@{PINNED}",
        "configs": {n: CONFIGS[n] for n in names},
    }
    doc |= {"summary": summary, "runs": results, "seconds": round(time.monotonic() - started)}
    doc["load_average_at_end"] = os.getloadavg()
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
