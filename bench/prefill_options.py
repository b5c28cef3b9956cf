"""Prefill speed of llama-server's options for long agent prompts on the CPU (issue 39), against the
command line modelrunner uses today (the baseline: bench/llama_servers.py).

An agent-like prompt (instructions, ten tool definitions as JSON, then the project's own source files as the
files read so far) of 2k, 6k and 12k tokens of SmolLM2-135M goes through /v1/chat/completions (greedy,
max_tokens 8, cache_prompt false, a new nonce at its start each round); the prompt tokens/s come from the
answer's `timings`, and per CPU-second of the server (/proc: what the shared machine's load moves least).
Every configuration runs at once in its own llama-server (idle, one costs nothing) and the rounds alternate
between them (each round in the reverse order of the last); ratios are to the baseline's median of the same
run. A 12k run takes ~2-3 minutes on the baseline, so `--keep` narrows each length after the first to the
baseline and the best N of the length before (0: all), and `--combine` adds the best two's flags together.

    .venv/bin/python bench/prefill_options.py [--lengths 2000,6000,12000] [--repeats 2,2,2]
        [--keep 0,3,1] [--combine] [--out bench/results/prefill_options.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.llama_servers import Server, agent_messages, servers, smollm2, start

CONTEXT, TRAINED = 16384, 8192  # SmolLM2 is trained to 8k: a 12k prompt needs the rope-extended context
CONFIGS: dict[str, list[str]] = {
    "baseline": [],  # -fa auto (on for this CPU backend), -b 2048 -ub 512, -t 2, 4 slots, f16 cache
    "fa-on": ["-fa", "on"],  # what auto resolves to: the same run twice, the noise of this machine
    "fa-off": ["-fa", "off"],
    "b512-ub512": ["-b", "512", "-ub", "512"],
    "ub256": ["-ub", "256"],
    "ub1024": ["-ub", "1024"],
    "ub2048": ["-ub", "2048"],
    "kv-q8_0": ["-ctk", "q8_0", "-ctv", "q8_0"],
    "ub2048+kv-q8_0": ["-ub", "2048", "-ctk", "q8_0", "-ctv", "q8_0"],
    "threads-auto": ["-t", "-1", "-tb", "-1"],  # llama.cpp's own choice of threads against -t 2
}
NOISE_CHECKS = {"fa-on", "threads-auto"}  # the baseline under another name: measured at the first length only


def run(server: Server, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "cache_prompt": False}
    started, cpu = time.perf_counter(), server.cpu_seconds()
    answer = server.chat(body)
    cpu = server.cpu_seconds() - cpu
    timings = answer["timings"]
    return {
        "cpu_s": cpu,
        "tokens_per_cpu_s": timings["prompt_n"] / cpu,
        "prompt_n": timings["prompt_n"],
        "prompt_ms": timings["prompt_ms"],
        "prompt_tps": timings["prompt_n"] / timings["prompt_ms"] * 1e3,
        "wall_s": time.perf_counter() - started,
        "content": answer["choices"][0]["message"]["content"],
    }


def measure(
    running: dict[str, Server], names: list[str], length: int, repeats: int, results: dict[str, Any]
) -> None:
    for round_ in range(repeats):
        # the same prompt for every configuration of a round; another nonce the next round
        messages = agent_messages(running["baseline"], length, f"{length}-{round_}-{time.time_ns()}")
        order = names if round_ % 2 == 0 else list(reversed(names))
        for name in order:
            got = run(running[name], messages)
            got["round"] = round_
            results.setdefault(str(length), {}).setdefault(name, []).append(got)
            print(
                f"{length:>6} r{round_} {name:<22} {got['prompt_n']:>6} tok {got['prompt_tps']:>7.1f} tok/s"
                f" {got['content']!r}",
                flush=True,
            )


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Per length and option: median prompt tokens/s (wall) and per CPU-second of the server, as ratios
    to the baseline's; whether each greedy answer is the baseline's of the same round."""
    table: dict[str, Any] = {}
    for length, by_name in results.items():
        base = statistics.median(r["prompt_tps"] for r in by_name["baseline"])
        base_cpu = statistics.median(r["tokens_per_cpu_s"] for r in by_name["baseline"])
        for name, runs in by_name.items():
            tps = statistics.median(r["prompt_tps"] for r in runs)
            per_cpu = statistics.median(r["tokens_per_cpu_s"] for r in runs)
            same = all(
                r["content"] == b["content"]
                for r in runs
                for b in by_name["baseline"]
                if b["round"] == r["round"]
            )
            table.setdefault(length, {})[name] = {
                "tokens": runs[0]["prompt_n"],
                "tps": round(tps, 1),
                "ratio": round(tps / base, 3),
                "tokens_per_cpu_s": round(per_cpu, 1),
                "cpu_ratio": round(per_cpu / base_cpu, 3),
                "runs": [round(r["prompt_tps"], 1) for r in runs],
                "same_answer_as_baseline": same,
            }
    return table


def combined(names: list[str]) -> list[str]:
    """The flags of several options together; a later option's flag replaces an earlier one's."""
    flags: dict[str, str] = {}
    for name in names:
        it = iter(CONFIGS[name])
        flags.update(zip(it, it, strict=True))
    return [part for pair in flags.items() for part in pair]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="2000,6000,12000")
    parser.add_argument("--repeats", default="2,2,2")
    parser.add_argument("--keep", default="0,3,1", help="per length: the best N of the last go on; 0: all")
    parser.add_argument("--combine", action="store_true", help="and the best two's flags together")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=Path("bench/results/prefill_options.json"))
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    repeats = [int(x) for x in args.repeats.split(",")]
    kept = [int(x) for x in args.keep.split(",")]
    names = args.configs.split(",")
    model = smollm2()
    results: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="prefill-options-"))
    started = time.monotonic()
    with servers({n: CONFIGS[n] for n in names}, model, CONTEXT, TRAINED, work) as running:
        for length, count, keep in zip(lengths, repeats, kept, strict=True):
            chosen = names if not results else [n for n in names if n not in NOISE_CHECKS]
            if keep and results:  # only the best of the last length go on
                last = summary(results)[str(lengths[lengths.index(length) - 1])]
                ranked = sorted(
                    (n for n in chosen if n != "baseline" and n in last), key=lambda n: -last[n]["ratio"]
                )
                best = ranked[:keep]
                chosen = ["baseline", *best]
                if args.combine and len(best) > 1 and "+".join(best[:2]) not in running:
                    combo = "+".join(best[:2])
                    CONFIGS[combo] = combined(best[:2])
                    running[combo] = start(combo, model, CONTEXT, TRAINED, CONFIGS[combo], work)
                    chosen.append(combo)
            measure(running, chosen, length, count, results)
    table = summary(results)
    print("\n| tokens | option | flags | prompt tok/s (runs) | ratio | tok per CPU-s | ratio | same answer |")
    print("|---|---|---|---|---|---|---|---|")
    for by_name in table.values():
        for name, c in by_name.items():
            runs = ", ".join(f"{r:.1f}" for r in c["runs"])
            flags = " ".join(CONFIGS[name]) or "(none)"
            print(
                f"| {c['tokens']} | {name} | `{flags}` | {c['tps']:.1f} ({runs}) |"
                f" {c['ratio']:.2f} | {c['tokens_per_cpu_s']:.1f} | {c['cpu_ratio']:.2f} |"
                f" {'yes' if c['same_answer_as_baseline'] else 'NO'} |"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "baseline_flags": "see bench/llama_servers.py baseline_argv",
                "model": model.name,
                "context": CONTEXT,
                "configs": {n: CONFIGS[n] for n in CONFIGS if any(n in t for t in table.values())},
                "summary": table,
                "runs": results,
                "seconds": round(time.monotonic() - started),
                "load_average_at_end": os.getloadavg(),
            },
            indent=1,
        )
    )
    print(f"wrote {args.out} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
