"""`model bench`: throughput of a model at several concurrency levels (non-streamed chat), printed as
DMR's bench.go prints it: its progress lines and hyperfine-like tables, or with --json its
`{"model", "prompt", "results"}` document of BenchmarkResult structs."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from modelrunner.cli.common import DmrArgs, UsageError, client, takes

DEFAULT_PROMPT = "Write a comprehensive 100 word summary on whales and their impact on society."


class LevelResult:
    """bench.go's BenchmarkResult of one concurrency level. (A plain class: dataclasses and threading are
    imported only when `bench` runs, not by every verb's start.)"""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.token_counts: list[int] = []  # of each request answered
        self.seconds = 0.0

    @property
    def tokens_per_second(self) -> float:
        return sum(self.token_counts) / self.seconds if self.seconds else 0.0

    @property
    def requests_per_second(self) -> float:
        return len(self.token_counts) / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        """BenchmarkResult as encoding/json writes it: its Go field names, TotalTime in nanoseconds."""
        return {
            "Concurrency": self.concurrency,
            "MeanRPS": _go_float(self.requests_per_second),
            "TotalTokens": sum(self.token_counts),
            "TPS": _go_float(self.tokens_per_second),
            "TotalTime": round(self.seconds * 1e9),
            "Requests": len(self.token_counts),
            "TokenCounts": self.token_counts,
        }


def _go_float(value: float) -> float | int:
    """A float64 as encoding/json writes it: a whole number without `.0`."""
    return int(value) if value.is_integer() else value


def _tokens(answer: dict[str, Any]) -> int:
    """sendChatRequest: the usage's completion tokens, else a quarter of the answer's characters."""
    completion = int((answer.get("usage") or {}).get("completion_tokens") or 0)
    if completion > 0:
        return completion
    choices = answer.get("choices") or [{}]
    return len(str((choices[0].get("message") or {}).get("content") or "")) // 4


def run_level(
    model: str, prompt: str, concurrency: int, duration: float, max_tokens: int, timeout: float = 300.0
) -> LevelResult:
    import threading

    daemon = client()
    result = LevelResult(concurrency)
    lock = threading.Lock()
    deadline = time.monotonic() + duration
    payload = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}

    def worker() -> None:
        while time.monotonic() < deadline:
            try:
                answer = daemon.call("POST", "/engines/v1/chat/completions", payload=payload, timeout=timeout)
            except Exception as exc:  # bench.go logs a failed request and goes on
                print(f"request failed during benchmark: {exc}", file=sys.stderr)
                continue
            with lock:
                result.token_counts.append(_tokens(answer))

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.seconds = time.monotonic() - started
    return result


def _levels(texts: list[str]) -> list[int]:
    """pflag's IntSlice: comma-separated numbers, a repeated flag adding to the list."""
    try:
        levels = [int(x) for text in texts for x in text.split(",")]
    except ValueError:
        raise UsageError("--concurrency takes numbers separated by commas, e.g. 1,2,4,8") from None
    if not levels or min(levels) < 1 or max(levels) > 256:
        raise UsageError("concurrency levels must be between 1 and 256")
    return levels


def _duration(text: str, flag: str, default: float) -> float:
    """A Go duration; 0 is bench.go's default, as it reads it."""
    from modelrunner.errors import ModelRunnerError
    from modelrunner.scheduler.durations import parse_keep_alive

    try:
        seconds = parse_keep_alive(text)
    except (ValueError, ModelRunnerError):
        raise UsageError(f"{flag} must be a positive duration such as 30s or 5m") from None
    if seconds == 0:
        return default
    if not 0 < seconds < 24 * 3600:
        raise UsageError(f"{flag} must be a positive duration such as 30s or 5m")
    return seconds


def cmd_bench(args: argparse.Namespace) -> None:
    from modelrunner.scheduler.durations import go_duration

    levels = _levels(args.concurrency or ["1,2,4,8"])
    duration = _duration(args.duration, "--duration", 30.0)
    timeout = _duration(args.timeout, "--timeout", 300.0)
    daemon = client()
    daemon.get_model(args.model)
    daemon.preload(args.model)  # load time is not throughput
    if not args.json:
        print(f"Prompt: {args.prompt}")
        print(f"Duration: {go_duration(duration)} per concurrency level")
        print(f"Concurrency levels: [{' '.join(map(str, levels))}]\n", flush=True)
    results = []
    for level in levels:
        if not args.json:
            print(f"Running benchmark with concurrency: {level}", flush=True)
        r = run_level(args.model, args.prompt, level, duration, args.max_tokens, timeout)
        results.append(r)
        if not args.json:
            print(f"  Tokens per second: {r.tokens_per_second:.2f} TPS")
            print(f"  Requests per second: {r.requests_per_second:.2f} RPS")
            print(f"  Total tokens: {sum(r.token_counts)}")
            print(f"  Total requests: {len(r.token_counts)}")
            print(f"  Total time: {go_duration(r.seconds)}\n", flush=True)
    results.sort(key=lambda r: r.concurrency)
    if args.json:
        from modelrunner.artifact import gojson

        document = {"model": args.model, "prompt": args.prompt, "results": [r.to_json() for r in results]}
        print(gojson.dumps_text(document, indent="  "))
        return
    sys.stdout.write(summary_text(results))


def summary_text(results: list[LevelResult]) -> str:
    """bench.go printBenchmarkTable: relative speeds against concurrency 1 (else the first level), the
    fastest marked, the summary and the detailed table."""
    if not results:
        return ""
    tps = [r.tokens_per_second for r in results]
    base = next((r.tokens_per_second for r in results if r.concurrency == 1), 0.0) or tps[0]
    best = max(tps)
    lines = ["", "Benchmark #1: Tokens per Second at Different Concurrency Levels", ""]
    for r in results:
        speed = r.tokens_per_second / base if base > 0 else 1.0
        mark = " fastest" if r.tokens_per_second == best and best > 0 else ""
        lines.append(
            f"Concurrency {r.concurrency}: {r.tokens_per_second:.2f} tokens/sec"
            f" (rel. speed: {speed:.2f}x){mark}"
        )
    lines += ["", "Summary:", "-" * 50, f"{'Metric':<25} {'Value':<20}", "-" * 50]
    if best > 0:
        best_level = next(r.concurrency for r in results if r.tokens_per_second == best)
        lines.append(f"{'Max Tokens/sec':<25} {best:<20.2f}")
        lines.append(f"{'Best concurrency':<25} {best_level:<20d}")
        if best_level > 1 and base > 0:
            lines.append(f"{'Improvement from 1':<25} {(best - base) / base * 100:<20.1f}%")
    lines += ["-" * 50, "", "Detailed Results:", "-" * 80]
    lines.append(
        f"{'Concurrency':<12} {'Tokens/sec':<15} {'Rel. Speed':<15} {'Requests/sec':<15} {'Total Tokens':<15}"
    )
    lines.append("-" * 80)
    for r in results:
        speed = r.tokens_per_second / base if base > 0 else 1.0
        lines.append(
            f"{r.concurrency:<12d} {r.tokens_per_second:<15.2f} {speed:<15.2f} "
            f"{r.requests_per_second:<15.2f} {sum(r.token_counts):<15d}"
        )
    lines.append("-" * 80)
    return "".join(line + "\n" for line in lines)


def add_commands(commands: Any) -> None:
    bench = commands.add_parser("bench", help="Measure a model's throughput at several concurrency levels.")
    bench.add_argument("model", nargs="?", help="model name, tag or ID")
    takes(bench, DmrArgs("bench", "MODEL", "model", failure="Failed to inspect model"))
    bench.add_argument(
        "--concurrency", action="append", help="levels, comma separated or repeated (default 1,2,4,8)"
    )
    bench.add_argument("--duration", default="30s", help="time per level (default 30s)")
    bench.add_argument("--timeout", default="5m", help="timeout of each request (default 5m)")
    bench.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message sent")
    bench.add_argument("--max-tokens", type=int, default=128, help="tokens per answer (default 128)")
    bench.add_argument("--json", action="store_true", help="results as JSON")
    bench.set_defaults(handler=cmd_bench)
