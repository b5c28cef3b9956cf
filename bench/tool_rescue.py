"""Benchmark reading tool calls written as text (compat/tool_rescue.py; issue 36 item 1: the reading was
quadratic, on the event loop: 130 KB of unclosed `<parameter=a>` froze the daemon ~50 s).

* CPU: the process's CPU seconds to read answers of 1 KB, 10 KB, 100 KB and 1 MB, whole (`rescue`) and
  streamed in pieces of 7 characters (`Holdback`, as the fake engine streams), for three texts: prose with a
  call at its end (ordinary), valid calls one after the other (many calls), and unclosed `<parameter=a>`
  in a `<function=...>` block (hostile). The code before the change is read from git (`git show
  REV:src/modelrunner/compat/tool_rescue.py`, REV = `--old`, by default the commit before the change) into a
  temporary module and measured beside it; a reading over `--limit` seconds is stopped and shown as `>limit`.
* Latency: the daemon (in-process, the scripted engine as llama.cpp, its answer from FAKE_TEXT_FILE) answers
  a chat request with tools whose 1 MB answer is read for calls, whole (n=2, as any vLLM answer); meanwhile
  one client asks `GET /version` again and again on one connection; the latencies of those polls.

    .venv/bin/python bench/tool_rescue.py [--old REV] [--limit 60] [--requests 5]

Prints the tables, writes JSON (bench/results/tool_rescue.json). Aim: linear CPU; a poll's median < 50 ms.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import httpx  # noqa: E402

from modelrunner.compat import tool_rescue  # noqa: E402
from tests.fake_engine import FakeEngine  # noqa: E402
from tests.inprocess import InProcessDaemon  # noqa: E402
from tests.models import write_tiny_gguf  # noqa: E402

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: dict[str, dict[str, Any]] = {"get_weather": WEATHER, "now": {}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
SIZES = [1024, 10 * 1024, 100 * 1024, 1024 * 1024]


def _fill(piece: str, size: int) -> str:
    return piece * max(1, size // len(piece))


TEXTS: dict[str, Callable[[int], str]] = {
    "ordinary": lambda size: _fill("The weather in Paris is mild today. ", size - len(CALL)) + CALL,
    "many calls": lambda size: _fill(CALL + "\n", size),
    "hostile": lambda size: "<function=get_weather>" + _fill("<parameter=a>", size) + "</function>",
}


class Expired(Exception):
    pass


def _expire(signum: int, frame: FrameType | None) -> None:
    raise Expired


def cpu(work: Callable[[], object], limit: float) -> float | None:
    """CPU seconds of `work`; None when it ran past `limit` seconds (stopped by an alarm)."""
    signal.setitimer(signal.ITIMER_REAL, limit)
    start = time.process_time()
    try:
        work()
    except Expired:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return time.process_time() - start


def streamed(module: Any, text: str) -> None:
    holdback = module.Holdback(TOOLS)
    for i in range(0, len(text), 7):
        holdback.feed(text[i : i + 7])
    holdback.end()


def old_module(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:src/modelrunner/compat/tool_rescue.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_tool_rescue.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_tool_rescue", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def cpu_table(old: ModuleType, limit: float) -> list[dict[str, Any]]:
    rows = []
    print(
        f"{'text':<11} {'size':>8} {'whole old':>10} {'whole new':>10} {'stream old':>11} {'stream new':>11}"
    )
    for name, make in TEXTS.items():
        for size in SIZES:
            text = make(size)
            row: dict[str, Any] = {"text": name, "chars": len(text)}
            for kind, module in (("old", old), ("new", tool_rescue)):
                row[f"whole_{kind}_s"] = cpu(functools.partial(module.rescue, text, TOOLS), limit)
                row[f"stream_{kind}_s"] = cpu(functools.partial(streamed, module, text), limit)
            rows.append(row)
            cells = [
                _seconds(row[k], limit)
                for k in ("whole_old_s", "whole_new_s", "stream_old_s", "stream_new_s")
            ]
            print(f"{name:<11} {len(text):>8} {cells[0]:>10} {cells[1]:>10} {cells[2]:>11} {cells[3]:>11}")
    return rows


def _seconds(value: float | None, limit: float) -> str:
    return f">{limit:.0f} s" if value is None else f"{value * 1000:.1f} ms"


def latencies(daemon: InProcessDaemon, requests: int) -> dict[str, Any]:
    """`GET /version` latencies while `requests` chat requests, one after the other, are read for calls."""
    body = {
        "model": "tiny",
        "n": 2,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [
            {"type": "function", "function": {"name": name, "parameters": schema}}
            for name, schema in TOOLS.items()
        ],
    }
    answers: list[float] = []

    def ask() -> None:
        with httpx.Client(base_url=daemon.url, timeout=600) as client:
            for _ in range(requests):
                start = time.monotonic()
                client.post("/engines/v1/chat/completions", json=body).raise_for_status()
                answers.append(time.monotonic() - start)

    polls: list[float] = []
    asking = threading.Thread(target=ask)
    with httpx.Client(base_url=daemon.url, timeout=600) as poll:
        poll.get("/version")
        asking.start()
        while asking.is_alive():
            start = time.monotonic()
            poll.get("/version").raise_for_status()
            polls.append(time.monotonic() - start)
    asking.join()
    ordered = sorted(polls)
    return {
        "requests": requests,
        "answer_s_median": round(statistics.median(answers), 4),
        "polls": len(polls),
        "poll_ms_median": round(statistics.median(polls) * 1000, 2),
        "poll_ms_p90": round(ordered[int(len(ordered) * 0.9)] * 1000, 2),
        "poll_ms_max": round(ordered[-1] * 1000, 2),
    }


def latency_table(requests: int) -> list[dict[str, Any]]:
    rows = []
    print(
        f"\n{'answer (1 MB)':<14} {'answer s':>9} {'polls':>6} {'median ms':>10} {'p90 ms':>8} {'max ms':>8}"
    )
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder) / "home"
        os.environ["MODEL_RUNNER_HOME"] = str(home)
        gguf = write_tiny_gguf(Path(folder) / "tiny.gguf")
        for name in ("hostile", "many calls"):
            answer = Path(folder) / "answer.txt"
            answer.write_text(TEXTS[name](1024 * 1024))
            daemon = InProcessDaemon(
                home, {"llama.cpp": FakeEngine(env={"FAKE_TEXT_FILE": str(answer)})}
            ).start()
            try:
                daemon.http("POST", "/models/package", json={"target": "tiny", "gguf": str(gguf)})
                preload = {"X-Preload-Only": "true"}
                daemon.http("POST", "/engines/v1/chat/completions", headers=preload, json={"model": "tiny"})
                row = {"answer": name, **latencies(daemon, requests)}
            finally:
                daemon.stop()
            rows.append(row)
            print(
                f"{name:<14} {row['answer_s_median']:>9} {row['polls']:>6} {row['poll_ms_median']:>10} "
                f"{row['poll_ms_p90']:>8} {row['poll_ms_max']:>8}"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", default="6f6025b~1", help="the git revision whose tool_rescue.py is 'old'")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds before a reading is stopped")
    parser.add_argument("--requests", type=int, default=5, help="1 MB answers read while /version is asked")
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _expire)
    cpu_rows = cpu_table(old_module(args.old), args.limit)
    latency_rows = latency_table(args.requests)
    out = ROOT / "bench" / "results" / "tool_rescue.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {"old": args.old, "limit_s": args.limit, "cpu": cpu_rows, "latency": latency_rows}, indent=2
        )
    )


if __name__ == "__main__":
    main()
