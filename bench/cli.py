"""Benchmark `model ls` against a running daemon, with `python -c pass` as the floor, in the same run.

A daemon with a few tiny models in its store; then, alternating, `python -c pass`, the `model` console
script (the command a user types) running `ls`, `ps`, `status` and `--help`, and with `--baseline SRC` the
same commands of another version (its `src` folder first on PYTHONPATH, e.g. `git archive main src | tar
-x -C /tmp/main`), each `--runs` times; medians of the wall times, and what `model ls` imports (`python -X
importtime`), the modules that cost most listed by their own and cumulative time.

Every command runs with its bytecode cached, as an installed package has it: PYTHONDONTWRITEBYTECODE is
dropped and the cache goes to a PYTHONPYCACHEPREFIX of its own (warmed before the timed runs), so that
compiling sources is not counted. Prints a table, writes JSON. Aim: `model ls` <= 50 ms.

    .venv/bin/python bench/cli.py [--runs 10] [--baseline /tmp/main/src]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.timing import command_seconds  # noqa: E402

from tests.daemon import Daemon, free_port  # noqa: E402
from tests.models import write_tiny_gguf  # noqa: E402

AIM_MS = 50.0
VERBS = (["ls"], ["ps"], ["status"], ["--help"])


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


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--models", type=int, default=3, help="tiny models in the store")
    parser.add_argument("--baseline", type=Path, help="the src folder of a version to compare with")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "cli.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-cli-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    daemon = Daemon(work / "home", free_port()).start()
    script = Path(sys.executable).with_name("model")
    model = [str(script)] if script.exists() else [sys.executable, "-m", "modelrunner"]
    under_python = [str(script)] if script.exists() else ["-m", "modelrunner"]  # for -X importtime
    try:
        gguf = write_tiny_gguf(work / "tiny.gguf")
        for i in range(args.models):
            response = daemon.http(
                "POST", "/models/package", json={"target": f"bench/tiny{i}:v1", "gguf": str(gguf)}
            )
            response.raise_for_status()
        env = daemon.cli_env(work / "pycache")
        versions = {"": env}
        if args.baseline is not None:
            versions["baseline "] = {**env, "PYTHONPATH": str(args.baseline.resolve())}
        commands = {"python -c pass": ([sys.executable, "-c", "pass"], env)}
        for label, version_env in versions.items():
            for verb in VERBS:
                commands[f"{label}model {' '.join(verb)}"] = ([*model, *verb], version_env)
        for command, command_env in commands.values():  # bytecode written, page cache and daemon warm
            command_seconds(command, command_env)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, (command, command_env) in commands.items():
                times[name].append(command_seconds(command, command_env))
        imports = import_costs([*under_python, "ls"], env)
        baseline_imports = (
            import_costs([*under_python, "ls"], versions["baseline "]) if args.baseline is not None else []
        )
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)

    floor_ms = median_ms(times["python -c pass"])
    ls_ms = median_ms(times["model ls"])
    by_cumulative = sorted(imports, key=lambda row: -int(str(row["cumulative_us"])))
    by_self = sorted(imports, key=lambda row: -int(str(row["self_us"])))

    def total_us(rows: list[dict[str, object]]) -> int:
        return sum(int(str(row["cumulative_us"])) for row in rows if row["depth"] == 0)

    result = {
        "benchmark": "cli",
        "runs": args.runs,
        "command": [*model, "ls"],
        "baseline": str(args.baseline) if args.baseline else None,
        "times_ms": {name: [round(t * 1000, 1) for t in runs] for name, runs in times.items()},
        "medians_ms": {name: round(median_ms(runs), 1) for name, runs in times.items()},
        "python_c_pass_median_ms": round(floor_ms, 1),
        "model_ls_median_ms": round(ls_ms, 1),
        "aim_ms": AIM_MS,
        "imports_total_ms": round(total_us(imports) / 1000, 1),
        "baseline_imports_total_ms": (
            round(total_us(baseline_imports) / 1000, 1) if baseline_imports else None
        ),
        "imports_top_cumulative": by_cumulative[:25],
        "imports_top_self": by_self[:25],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"| {'':24} | {'median ms':>9} |")
    print(f"|{'-' * 26}|{'-' * 11}|")
    for name, runs in times.items():
        print(f"| {name:24} | {median_ms(runs):>9.1f} |")
    print(f"model ls - floor: {ls_ms - floor_ms:.1f} ms; aim: model ls <= {AIM_MS:.0f} ms")
    print(f"imports of `model ls`: {total_us(imports) / 1000:.1f} ms in all (under -X importtime)")
    if baseline_imports:
        print(f"imports of the baseline's `model ls`: {total_us(baseline_imports) / 1000:.1f} ms")
    print("top modules by cumulative import time (ms, self ms):")
    for row in by_cumulative[:15]:
        cumulative, own = int(str(row["cumulative_us"])) / 1000, int(str(row["self_us"])) / 1000
        print(f"  {cumulative:7.1f} {own:6.1f}  {row['module']}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
