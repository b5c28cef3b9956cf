"""Benchmark how the daemon's costs grow with its work (issue #25 aim 3), each cost against its load.

* Models in the store (1, 10, 100, 1,000): `GET /models` (the first call after the store grew, which reads
  the new manifests, and the median of the calls after it) and `model ls` (the console script a user types,
  its table printed to a pipe, its bytecode cached as in bench/cli.py) beside `python -c pass` (the
  floor). The store grows through the store API (ModelStore.add_model of models that differ only in their
  config's creation time and share one tiny GGUF layer, fsync skipped), not through 1,000 CLI calls.
* Open streams (1, 10, 100, 256, ...): the daemon's resident memory (VmRSS from /proc, its own process, not
  its engine child) with that many chat streams held open through it, against the same daemon with none
  open; per stream = the difference / streams. The engine is the relay benchmark's stand-in
  (bench/standin_engine.py) with a slow step, so every stream stays open while it is measured.
* The request recorder (server/recorder.py) with 64 KiB request and answer bodies, 1 to 10,000 records over
  100 models (its cap: 10 records a model, 100 models, MODEL_RUNNER_RECORD_MAX_BYTES all together): the
  bytes it counts and the Python memory it holds (tracemalloc), after the records were listed.

    .venv/bin/python bench/growth.py [--models 1,10,100,1000] [--streams 1,10,100,256] [--runs 10]

Prints the tables, writes JSON (bench/results/growth.json). Aims: `model ls` <= 100 ms and `/models` <=
30 ms with 1,000 models; RSS <= 150 MB with 256 streams; the recorder within its budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.relay import add_bench_model, use_standin_engine  # noqa: E402
from bench.timing import command_seconds  # noqa: E402

from modelrunner.artifact.builder import PackageSpec, build_artifact  # noqa: E402
from modelrunner.artifact.manifest import sha256_digest  # noqa: E402
from modelrunner.server.access import Access, RequestHead  # noqa: E402
from modelrunner.server.recorder import Recorder  # noqa: E402
from modelrunner.store.sink import StoreSink  # noqa: E402
from modelrunner.store.store import ModelStore  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import write_tiny_gguf  # noqa: E402

BODY = 64 * 1024


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2)


class StoreFiller:
    """Adds models to a store through its API: one packaged tiny GGUF, then copies of its manifest whose
    config differs only in its creation time (so each is a model of its own, sharing the layer)."""

    def __init__(self, store: ModelStore, work: Path) -> None:
        self.store = store
        built = build_artifact(PackageSpec(gguf=write_tiny_gguf(work / "tiny.gguf")), StoreSink(store))
        self.manifest = json.loads(built.manifest_bytes)
        self.config = json.loads(built.config_bytes)
        self.created = datetime(2026, 1, 1, tzinfo=UTC)
        self.count = 0

    def fill_to(self, total: int) -> None:
        with mock.patch("os.fsync"):  # a store built to be listed: its durability is not what is measured
            self._fill_to(total)

    def _fill_to(self, total: int) -> None:
        while self.count < total:
            stamp = self.created + timedelta(seconds=self.count)
            self.config["descriptor"]["created"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
            config_bytes = json.dumps(self.config).encode()
            digest = self.store.write_blob_bytes(config_bytes)
            self.manifest["config"].update(digest=digest, size=len(config_bytes))
            self.store.add_model(json.dumps(self.manifest).encode(), [f"bench/model-{self.count}:latest"])
            self.count += 1


def store_growth(work: Path, levels: list[int], runs: int) -> list[dict[str, Any]]:
    daemon = Daemon(work / "store-home", free_port()).start()
    script = Path(sys.executable).with_name("model")
    model = [str(script)] if script.exists() else [sys.executable, "-m", "modelrunner"]
    # bytecode cached, as an installed package has it (bench/cli.py): compiling is not what is measured
    env = daemon.cli_env(work / "pycache")
    rows = []
    client = httpx.Client(base_url=daemon.url, timeout=60)  # kept alive: the daemon's cost, not a connect's
    try:
        filler = StoreFiller(ModelStore(daemon.store_root), work)
        for level in levels:
            filler.fill_to(level)
            first = time.perf_counter()
            listed = client.get("/models").json()
            first_s = time.perf_counter() - first
            assert len(listed) == level, len(listed)
            api = []
            for _ in range(runs):
                start = time.perf_counter()
                client.get("/models").raise_for_status()
                api.append(time.perf_counter() - start)
            command_seconds([*model, "ls"], env)  # its bytecode written
            ls = [command_seconds([*model, "ls"], env) for _ in range(runs)]
            floor = [command_seconds([sys.executable, "-c", "pass"], env) for _ in range(runs)]
            row = {
                "models": level,
                "api_first_ms": round(first_s * 1000, 2),
                "api_ms": median_ms(api),
                "ls_ms": median_ms(ls),
                "python_floor_ms": median_ms(floor),
                "api_bytes": len(json.dumps(listed)),
            }
            print(row, flush=True)
            rows.append(row)
    finally:
        client.close()
        daemon.stop()
    return rows


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def open_stream(port: int, body: bytes) -> asyncio.StreamWriter:
    """A chat stream through the daemon, read until its first chunk; left open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /engines/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    await reader.readuntil(b"data: ")
    return writer


async def hold_streams(port: int, body: bytes, count: int, pid: int) -> int:
    writers = await asyncio.gather(*(open_stream(port, body) for _ in range(count)))
    await asyncio.sleep(1.0)  # let the daemon settle with all of them open
    rss = rss_bytes(pid)
    for writer in writers:
        writer.close()
    return rss


def stream_growth(work: Path, levels: list[int]) -> dict[str, Any]:
    use_standin_engine(work, 500)
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "go"}],
            "stream": True,
            "max_tokens": 10**6,
        }
    ).encode()
    daemon = Daemon(work / "stream-home", free_port()).start()
    rows = []
    try:
        assert daemon.process is not None
        pid = daemon.process.pid
        add_bench_model(daemon, work)
        asyncio.run(hold_streams(daemon.port, body, 1, pid))  # load the engine, warm the paths
        time.sleep(1.5)
        idle = rss_bytes(pid)
        for level in levels:
            rss = asyncio.run(hold_streams(daemon.port, body, level, pid))
            row = {
                "streams": level,
                "rss_mb": round(rss / 1e6, 1),
                "per_stream_kb": round((rss - idle) / level / 1e3, 1),
            }
            print(row, flush=True)
            rows.append(row)
            time.sleep(1.5)  # the closed streams' cancellations reach the engine
        after = rss_bytes(pid)
    finally:
        daemon.stop()
    return {"idle_rss_mb": round(idle / 1e6, 1), "rss_mb_after_all": round(after / 1e6, 1), "levels": rows}


def recorder_growth(levels: list[int]) -> list[dict[str, Any]]:
    """Records with 64 KiB bodies into one recorder, listed after each level (as a client reads them)."""
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * (BODY - 60) + b'"}]}'
    answer = b'{"choices":[{"message":{"content":"' + b"y" * (BODY - 60) + b'"}}]}'
    tracemalloc.start()
    recorder = Recorder()
    base = tracemalloc.get_traced_memory()[0]
    rows = []
    added = 0
    for level in levels:
        while added < level:
            head = RequestHead("POST", "/engines/v1/chat/completions", "openai", f"r{added}", "bench", 0.0)
            model_id = sha256_digest(b"%d" % (added % 100))
            record = recorder.start(head, body, "m", model_id, {})
            record.answer_head(200, [(b"content-type", b"application/json")])
            record.tee(answer)
            recorder.finish(record, Access(head, "m", 200, len(answer), 1.0, 2.0, "complete"))
            added += 1
        for _ in recorder.listing_chunks(None):
            pass
        held = tracemalloc.get_traced_memory()[0] - base
        kept = sum(len(records) for records in recorder.models.values())
        row = {
            "records_added": level,
            "records_kept": kept,
            "counted_mb": round(recorder.size / 2**20, 2),
            "held_mb": round(held / 2**20, 2),
            "budget_mb": round(recorder.max_bytes / 2**20, 2),
        }
        print(row, flush=True)
        rows.append(row)
    tracemalloc.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="1,10,100,1000")
    parser.add_argument("--streams", default="1,10,100,256")
    parser.add_argument("--records", default="1,10,100,1000,10000")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "growth.json")
    args = parser.parse_args()

    def levels(text: str) -> list[int]:
        return [int(item) for item in text.split(",") if item]

    work = Path(tempfile.mkdtemp(prefix="bench-growth-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    try:
        result = {
            "benchmark": "growth",
            "cpus": os.cpu_count(),
            "store": store_growth(work, levels(args.models), args.runs),
            "streams": stream_growth(work, levels(args.streams)),
            "recorder": recorder_growth(levels(args.records)),
            "load_average_after": os.getloadavg(),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
