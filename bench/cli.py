"""Benchmark `model ls` against a running daemon, with `python -c pass` as the floor, in the same run.

A daemon with a few tiny models in its store; then, alternating, `python -c pass` and the `model ls` console
script (the command a user types), each `--runs` times; medians of the wall times, and what `model ls`
imports (`python -X importtime`), the modules that cost most listed by their own and cumulative time.
Prints a table, writes JSON. Aim: `model ls` <= 50 ms.

    .venv/bin/python bench/cli.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import write_tiny_gguf  # noqa: E402

AIM_MS = 50.0


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def import_costs(command: list[str], env: dict[str, str]) -> list[dict[str, object]]:
    """`-X importtime` of the command: one row per module, self and cumulative microseconds."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *command],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    rows = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|")
        depth = (len(name) - len(name.lstrip()) - 1) // 2  # the tree's indentation
        rows.append(
            {"module": name.strip(), "depth": depth, "self_us": int(own), "cumulative_us": int(cumulative)}
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--models", type=int, default=3, help="tiny models in the store")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "cli.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-cli-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    daemon = Daemon(work / "home", free_port()).start()
    model_script = Path(sys.executable).with_name("model")
    model = [str(model_script)] if model_script.exists() else [sys.executable, "-m", "modelrunner"]
    try:
        gguf = write_tiny_gguf(work / "tiny.gguf")
        for i in range(args.models):
            response = daemon.http(
                "POST", "/models/package", json={"target": f"bench/tiny{i}:v1", "gguf": str(gguf)}
            )
            response.raise_for_status()
        env = daemon.env
        floor_command = [sys.executable, "-c", "pass"]
        ls_command = [*model, "ls"]
        timed(floor_command, env), timed(ls_command, env)  # warm the page cache and the daemon
        floor_times, ls_times = [], []
        for _ in range(args.runs):
            floor_times.append(timed(floor_command, env))
            ls_times.append(timed(ls_command, env))
        imports = import_costs(["-m", "modelrunner", "ls"], env)
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)

    floor_ms = statistics.median(floor_times) * 1000
    ls_ms = statistics.median(ls_times) * 1000
    by_cumulative = sorted(imports, key=lambda row: -int(str(row["cumulative_us"])))
    by_self = sorted(imports, key=lambda row: -int(str(row["self_us"])))
    total_import_us = sum(int(str(row["cumulative_us"])) for row in imports if row["depth"] == 0)
    result = {
        "benchmark": "cli",
        "runs": args.runs,
        "command": ls_command,
        "python_c_pass_ms": [round(t * 1000, 1) for t in floor_times],
        "model_ls_ms": [round(t * 1000, 1) for t in ls_times],
        "python_c_pass_median_ms": round(floor_ms, 1),
        "model_ls_median_ms": round(ls_ms, 1),
        "aim_ms": AIM_MS,
        "imports_total_ms": round(total_import_us / 1000, 1),
        "imports_top_cumulative": by_cumulative[:25],
        "imports_top_self": by_self[:25],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"| {'':22} | {'median ms':>9} |")
    print(f"|{'-' * 24}|{'-' * 11}|")
    print(f"| {'python -c pass':22} | {floor_ms:>9.1f} |")
    print(f"| {'model ls':22} | {ls_ms:>9.1f} |")
    print(f"model ls - floor: {ls_ms - floor_ms:.1f} ms; aim: model ls <= {AIM_MS:.0f} ms")
    print(f"imports of `python -m modelrunner ls`: {total_import_us / 1000:.1f} ms in all")
    print("top modules by cumulative import time (ms, self ms):")
    for row in by_cumulative[:15]:
        cumulative, own = int(str(row["cumulative_us"])) / 1000, int(str(row["self_us"])) / 1000
        print(f"  {cumulative:7.1f} {own:6.1f}  {row['module']}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
