"""Draftless n-gram speculative decoding on an edit turn (issue 39): a model asked to rewrite a 187-line
Python file whole with one small change copies most of its answer from its prompt, which llama.cpp's
n-gram drafts (b11434 `--spec-type ngram-simple`, `ngram-mod`, `ngram-map-k`) can propose for the
model to verify in one batch. Against the same server without drafting (the baseline command line of
bench/llama_servers.py), greedy: generation tokens/s (the answer's `timings`), the drafts accepted
(`draft_n_accepted` / `draft_n`), whether the answer is byte-identical to the undrafted one of the same
round, and how alike it is to the expected file. Every configuration runs in its own llama-server at once;
the rounds alternate between them, each in the reverse order of the last; ratios are to the undrafted
median of the same run.

Turns: SmolLM2 (an instruction model) gets the edit as a chat turn (`edit`) and a plain chat answer
(`chat`: nothing to copy, what drafting costs where it does not pay). Gemma 3 270M is a base model: it
gets the same edit as a document to continue (`copy`: the file, then the file again after the rename, its
first line given) and a prose continuation (`prose`). Where a drafted completion leaves the undrafted one,
both are generated again to that token with their top log-probabilities (`divergence`): how near a tie the
undrafted model's choice was, and what the verifying batch computed there.

The file is src/modelrunner/client_types.py as of commit b8690de (pinned: the source moves on).

    .venv/bin/python bench/edit_drafting.py [--model gemma|smollm2] [--rounds 2]
        [--max-tokens 4096] [--configs none,ngram-mod,...] [--turns copy,prose]
        [--out bench/results/edit_drafting-MODEL.json]
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


def pinned_source() -> str:
    return subprocess.run(
        ["git", "show", f"{PINNED}:{FILE}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def renamed(source: str) -> str:
    return re.sub(r"\b_int\b", "_as_int", source)


def edit_turn() -> tuple[list[dict[str, str]], str]:
    """The edit's messages (an instruction model's turn), and the file the edit should give."""
    source = pinned_source()
    ask = (
        f"Here is `{Path(FILE).name}`:\n\n```python\n{source}```\n\nRename the function `_int` to `_as_int`"
        " everywhere in this file. Reply with the whole updated file in one ```python block and nothing else."
    )
    messages = [{"role": "system", "content": "You are a careful coding assistant."}]
    return [*messages, {"role": "user", "content": ask}], renamed(source)


def copy_turn() -> tuple[str, str]:
    """The same edit as a base model takes it, a document to continue: the file, then the file again with
    the rename, its first line given. A base model copies what it has read (the answer an agent's edit
    turn is made of), which is what n-gram drafts predict; the expected text is the rest of the file."""
    source = pinned_source()
    first, _, rest = renamed(source).partition("\n")
    prompt = (
        f"# {FILE}, before the change:\n```python\n{source}```\n\n# {FILE}, after renaming `_int` to"
        f" `_as_int` everywhere (the whole file):\n```python\n{first}\n"
    )
    return prompt, rest


CHAT = [{"role": "user", "content": "Explain in about 200 words why the sky is blue and sunsets are red."}]
PROSE = "Why is the sky blue, and why are sunsets red? The short answer is that"


def run(server: Server, turn: str, prompt: Any, max_tokens: int) -> dict[str, Any]:
    """One greedy answer: a chat turn (`prompt` is its messages) or a completion (a string)."""
    body = {"max_tokens": max_tokens, "temperature": 0, "cache_prompt": False}
    started = time.perf_counter()
    if turn in CHAT_TURNS:
        answer = server.chat({**body, "messages": prompt})
        content, finish = answer["choices"][0]["message"]["content"], answer["choices"][0]["finish_reason"]
        tokens: list[int] = []
    else:
        answer = server.complete({**body, "prompt": prompt, "n_predict": max_tokens, "return_tokens": True})
        content, tokens = answer["content"], answer["tokens"]
        finish = "length" if answer.get("stop_type") == "limit" else "stop"
    t = answer["timings"]
    return {
        "predicted_n": t["predicted_n"],
        "gen_tps": t["predicted_n"] / t["predicted_ms"] * 1e3,
        "wall_s": round(time.perf_counter() - started, 2),
        "draft_n": t.get("draft_n", 0),
        "draft_accepted": t.get("draft_n_accepted", 0),
        "finish": finish,
        "content": content,
        "tokens": tokens,
    }


def divergence(
    undrafted_server: Server, drafted_server: Server, prompt: str, undrafted: list[int], drafted: list[int]
) -> dict[str, Any] | None:
    """Where a drafted completion leaves the undrafted one, and how near a tie the choice was there: both
    answers again up to that token with their top candidates' log-probabilities as each server computed
    them while generating (one-token decoding without drafts, the verifying batch with them)."""
    at = next((i for i, (a, b) in enumerate(zip(undrafted, drafted, strict=False)) if a != b), None)
    if at is None:
        return None
    body = {"prompt": prompt, "n_predict": at + 1, "n_probs": 3, "temperature": 0, "cache_prompt": False}
    found: dict[str, Any] = {"token": at}
    for name, server, tokens in (
        ("undrafted", undrafted_server, undrafted),
        ("drafted", drafted_server, drafted),
    ):
        again = server.complete({**body, "return_tokens": True})
        top = again["completion_probabilities"][at]["top_logprobs"]
        found[name] = {
            "chose": tokens[at],
            "same_again": again["tokens"][: at + 1] == tokens[: at + 1],
            "top": [[c["id"], c["token"], round(c["logprob"], 4)] for c in top],
        }
    top = found["undrafted"]["top"]
    found["undrafted_margin"] = round(top[0][2] - top[1][2], 4)
    return found


CHAT_TURNS = {"edit", "chat"}
MODEL_TURNS = {"smollm2": ["edit", "chat"], "gemma": ["copy", "prose"]}  # Gemma 3 270M is a base model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["gemma", "smollm2"], default="gemma")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096, help="of the edit's answer (the file: ~1.8k)")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--turns", help="of edit,copy,chat,prose (default: the model's, MODEL_TURNS)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or Path(f"bench/results/edit_drafting-{args.model}.json")
    names = args.configs.split(",")
    work = Path(tempfile.mkdtemp(prefix="edit-drafting-"))
    model = gemma(work) if args.model == "gemma" else smollm2()
    edit, expected_edit = edit_turn()
    copy, expected_copy = copy_turn()
    every: dict[str, tuple[Any, int, str | None]] = {
        "edit": (edit, args.max_tokens, expected_edit),
        "copy": (copy, args.max_tokens, expected_copy),
        "chat": (CHAT, 300, None),
        "prose": (PROSE, 300, None),
    }
    turns = {name: every[name] for name in (args.turns.split(",") if args.turns else MODEL_TURNS[args.model])}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    started = time.monotonic()
    trained = TRAINED[args.model]
    # the GGUF's own template is ChatML, which Gemma answers with noise: the daemon gives it modelrunner's
    own = ["--chat-template-file", str(GEMMA_TEMPLATE)] if args.model == "gemma" else []
    with servers({n: [*own, *CONFIGS[n]] for n in names}, model, trained, trained, work) as running:
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else list(reversed(names))
            for turn, (prompt, max_tokens, _) in turns.items():
                for name in order:
                    got = run(running[name], turn, prompt, max_tokens)
                    got["round"] = round_
                    results.setdefault(turn, {}).setdefault(name, []).append(got)
                    print(
                        f"r{round_} {turn:<5} {name:<24} {got['predicted_n']:>5} {got['gen_tps']:>6.1f} tok/s"
                        f" drafts {got['draft_accepted']}/{got['draft_n']} {got['finish']}",
                        flush=True,
                    )
        # where a drafted completion first left the undrafted one of its round, probed while the servers run
        probes: dict[tuple[str, str], dict[str, Any] | None] = {}
        for turn, by_name in results.items():
            if turn in CHAT_TURNS:
                continue
            alone = {b["round"]: b["tokens"] for b in by_name["none"]}
            for name, runs in by_name.items():
                left = [r for r in runs if name != "none" and r["tokens"] != alone[r["round"]]]
                if left:
                    first = left[0]
                    probes[turn, name] = divergence(
                        running["none"], running[name], turns[turn][0], alone[first["round"]], first["tokens"]
                    )
    summary: dict[str, Any] = {}
    print("\n| turn | drafting | flags | tokens | gen tok/s | ratio | accepted | same as none | edit right |")
    print("|---|---|---|---|---|---|---|---|---|")
    for turn, by_name in results.items():
        expected = turns[turn][2]
        base = statistics.median(r["gen_tps"] for r in by_name["none"])
        for name, runs in by_name.items():
            tps = statistics.median(r["gen_tps"] for r in runs)
            drafted = sum(r["draft_n"] for r in runs)
            accepted = sum(r["draft_accepted"] for r in runs) / drafted if drafted else None
            alone = {b["round"]: b for b in by_name["none"]}
            same = all(r["content"] == alone[r["round"]]["content"] for r in runs)
            row = {
                "tokens": runs[0]["predicted_n"],
                "gen_tps": round(tps, 1),
                "ratio": round(tps / base, 3),
                "runs": [round(r["gen_tps"], 1) for r in runs],
                "accepted": None if accepted is None else round(accepted, 3),
                "byte_identical_to_none": same,
            }
            right = "-"
            if expected is not None:
                code = FENCE.search(runs[0]["content"]) if turn == "edit" else None
                got_file = code[1] if code else runs[0]["content"].partition("```")[0]
                similar = difflib.SequenceMatcher(None, got_file, expected, autojunk=False).ratio()
                row |= {"exact_edit": got_file == expected, "similarity_to_expected": round(similar, 3)}
                right = f"{row['exact_edit']} ({similar:.0%} alike)"
            if (turn, name) in probes:
                row["divergence"] = probes[turn, name]
            summary.setdefault(turn, {})[name] = row
            rate = "-" if accepted is None else f"{accepted:.0%}"
            print(
                f"| {turn} | {name} | `{' '.join(CONFIGS[name]) or '(none)'}` | {row['tokens']} | {tps:.1f} |"
                f" {tps / base:.2f} | {rate} | {'yes' if same else 'NO'} | {right} |"
            )
            if row.get("divergence"):
                print(f"    diverges: {row['divergence']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "model": model.name,
        "file": f"{FILE}@{PINNED}",
        "configs": {n: CONFIGS[n] for n in names},
    }
    for answer in (r for by_name in results.values() for rs in by_name.values() for r in rs):
        del answer["tokens"]  # the content says it; token IDs were for the probes
    doc |= {"summary": summary, "runs": results, "seconds": round(time.monotonic() - started)}
    doc["load_average_at_end"] = os.getloadavg()
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
