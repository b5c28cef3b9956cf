"""Benchmark `model package` of a 1 GiB GGUF against the hash alone and `cp` of the same file, in one run.

Packaging hashes the file and copies it into the store (fsynced before the rename). References, alternating
with it: `cp` alone into the store's folder, `cp` then `sync FILE`
(the same copy made durable, as the store's is), `openssl dgst -sha256` of the file alone (the hash at
full speed, SHA-NI, the same library as Python's hashlib: the floor of any copy that is hashed; issue 25's
aim: `model package` <= 1.1x its time, the CLI included), and
`sha256sum` then `cp` (the two jobs one after the other with the standard tools; Debian's sha256sum does
not use SHA-NI and is ~4x slower than openssl here). Page cache: the GGUF is cached (warm) for every run,
each copy is a new file, and `sync` runs before each timed run so that no run waits on the writeback of
the one before. `model package` is timed as a user sees it: the CLI process (its bytecode cached, as an
installed package has it), the daemon's checks and the copy; `daemon alone` is its request to the daemon
(`POST /models/package`) without the CLI. Medians and the ratios model package / reference (lower is
better) are printed and written as JSON.

    .venv/bin/python bench/package.py [--size-mib 1024] [--runs 3]
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
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.timing import table_rows, timed  # noqa: E402

from tests.daemon import Daemon, free_port  # noqa: E402


def write_big_gguf(path: Path, size_mib: int) -> None:
    """A valid GGUF whose one F32 tensor holds `size_mib` MiB of random data."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(2048)
    elements = size_mib * 1024 * 1024 // 4
    data = np.random.default_rng(0).standard_normal(elements, dtype=np.float32)
    writer.add_tensor("token_embd.weight", data.reshape(-1, 1024))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


NAMES = ("cp", "cp + sync", "sha256 (openssl)", "sha256sum + cp", "daemon alone", "model package")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "package.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-package-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    daemon = Daemon(work / "home", free_port()).start()
    times: dict[str, list[float]] = {name: [] for name in NAMES}
    cpu: dict[str, list[float]] = {name: [] for name in NAMES}
    try:
        model_file = work / "big.gguf"
        write_big_gguf(model_file, args.size_mib)
        size = model_file.stat().st_size
        copy_target = daemon.store_root / "bench-cp-copy"  # the store's own folder and file system
        script = Path(sys.executable).with_name("model")
        model = [str(script)] if script.exists() else [sys.executable, "-m", "modelrunner"]
        cli_env = daemon.cli_env(work / "pycache")

        def quiet(command: list[str], env: dict[str, str] | None = None) -> None:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)

        def cp() -> None:
            quiet(["cp", str(model_file), str(copy_target)])

        def cp_sync() -> None:
            cp()
            quiet(["sync", str(copy_target)])

        def sha256() -> None:
            quiet(["openssl", "dgst", "-sha256", str(model_file)])

        def sha256sum_cp() -> None:
            quiet(["sha256sum", str(model_file)])
            cp()

        def daemon_alone() -> None:
            body = {"target": "bench:big", "gguf": str(model_file)}
            daemon.http("POST", "/models/package", json=body, timeout=600).raise_for_status()

        def package() -> None:
            quiet([*model, "package", "--gguf", str(model_file), "bench:big"], env=cli_env)

        def clean() -> None:
            copy_target.unlink(missing_ok=True)
            if daemon.models():
                quiet([*model, "rm", "bench:big"], env=cli_env)

        runs: dict[str, Callable[[], None]] = {
            "cp": cp,
            "cp + sync": cp_sync,
            "sha256 (openssl)": sha256,
            "sha256sum + cp": sha256sum_cp,
            "daemon alone": daemon_alone,
            "model package": package,
        }
        for run in runs.values():  # warm the page cache and the daemon
            run()
            clean()
        for _ in range(args.runs):
            for name, run in runs.items():
                wall, used = timed(run, daemon.process.pid if daemon.process else None)
                times[name].append(wall)
                cpu[name].append(used)
                clean()
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)

    medians = {name: statistics.median(values) for name, values in times.items()}
    ratios = {name: medians["model package"] / medians[name] for name in NAMES if name != "model package"}
    result = {
        "benchmark": "package",
        "file_bytes": size,
        "runs": args.runs,
        "page_cache": "GGUF warm; each copy a new file; sync before each timed run",
        "seconds": times,
        "cpu_seconds": cpu,
        "median_s": {name: round(value, 3) for name, value in medians.items()},
        "package_time_over_reference": {name: round(value, 3) for name, value in ratios.items()},
        "aim": "model package <= 1.1 x sha256 (openssl), the CLI included (issue 25)",
        "cpus": os.cpu_count(),
        "load_average_after": os.getloadavg(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(table_rows(times, cpu, size)))
    summary = ", ".join(f"{name} **{ratio:.2f}**" for name, ratio in ratios.items())
    print(f"model package time / reference time: {summary} (aim <= 1.1 against sha256 (openssl))")
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
