"""`model bench`: throughput of a model at several concurrency levels (non-streamed chat, as DMR's)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from modelrunner.cli.common import DmrArgs, UsageError, client, takes

DEFAULT_PROMPT = "Write a short paragraph about the sea."


class LevelResult:
    """What one concurrency level did. (A plain class: dataclasses, statistics and threading are imported
    only when `bench` runs, not by every verb's start.)"""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.requests = 0
        self.errors = 0
        self.completion_tokens = 0
        self.seconds = 0.0
        self.latencies: list[float] = []

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        import statistics

        latencies = sorted(self.latencies)
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "completion_tokens": self.completion_tokens,
            "tokens_per_second": round(self.tokens_per_second, 2),
            "requests_per_second": round(self.requests_per_second, 3),
            "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
            "latency_p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 3) if latencies else None,
        }


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
            started = time.monotonic()
            try:
                answer = daemon.call("POST", "/engines/v1/chat/completions", payload=payload, timeout=timeout)
                tokens = int((answer.get("usage") or {}).get("completion_tokens", 0))
                ok = True
            except Exception:
                tokens, ok = 0, False
            with lock:
                result.requests += ok
                result.errors += not ok
                result.completion_tokens += tokens
                if ok:
                    result.latencies.append(time.monotonic() - started)

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.seconds = time.monotonic() - started
    return result


def cmd_bench(args: argparse.Namespace) -> None:
    from modelrunner.scheduler.durations import parse_keep_alive

    try:
        levels = sorted({int(x) for x in args.concurrency.split(",")})
    except ValueError:
        raise UsageError("--concurrency takes numbers separated by commas, e.g. 1,2,4,8") from None
    if not levels or levels[0] < 1 or levels[-1] > 256:
        raise UsageError("concurrency levels must be between 1 and 256")
    duration = parse_keep_alive(args.duration)
    if not 0 < duration < 24 * 3600:
        raise UsageError("--duration must be a positive duration such as 30s or 2m")
    timeout = parse_keep_alive(args.timeout)
    if not 0 < timeout < 24 * 3600:
        raise UsageError("--timeout must be a positive duration such as 30s or 5m")
    daemon = client()
    daemon.get_model(args.model)
    daemon.preload(args.model)  # load time is not throughput
    results = [
        run_level(args.model, args.prompt, level, duration, args.max_tokens, timeout) for level in levels
    ]
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
        return
    from modelrunner.cli.render import table

    rows = [
        [
            str(r.concurrency),
            str(r.requests),
            str(r.errors),
            f"{r.tokens_per_second:.1f}",
            f"{r.requests_per_second:.2f}",
            f"{r.to_json()['latency_p50_s']}",
        ]
        for r in results
    ]
    print(table(["CONCURRENCY", "REQUESTS", "ERRORS", "TOKENS/S", "REQUESTS/S", "P50 LATENCY (S)"], rows))
    best = max(results, key=lambda r: r.tokens_per_second)
    base = results[0].tokens_per_second
    gain = (
        f" ({(best.tokens_per_second / base - 1) * 100:+.0f}% over concurrency {results[0].concurrency})"
        if base
        else ""
    )
    print(f"Best concurrency: {best.concurrency} at {best.tokens_per_second:.1f} tokens/s{gain}")


def add_commands(commands: Any) -> None:
    bench = commands.add_parser("bench", help="Measure a model's throughput at several concurrency levels.")
    bench.add_argument("model", nargs="?", help="model name, tag or ID")
    takes(bench, DmrArgs("bench", "MODEL", "model"))
    bench.add_argument("--concurrency", default="1,2,4,8", help="levels, comma separated (default 1,2,4,8)")
    bench.add_argument("--duration", default="30s", help="time per level (default 30s)")
    bench.add_argument("--timeout", default="5m", help="timeout of each request (default 5m)")
    bench.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message sent")
    bench.add_argument("--max-tokens", type=int, default=128, help="tokens per answer (default 128)")
    bench.add_argument("--json", action="store_true", help="results as JSON")
    bench.set_defaults(handler=cmd_bench)
