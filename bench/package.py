"""Benchmark `model package` against `sha256sum` + `cp` of the same 1 GiB GGUF, in the same run.

Packaging must hash the file and copy it into the store; the reference does the same two jobs with the
standard tools, one after the other. Both run warm (file in the page cache), alternating, several times;
the table shows medians and the ratio ours / reference (lower is better, aim <= 1.0).

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
import time
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def timed(command: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


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
    try:
        model_file = work / "big.gguf"
        write_big_gguf(model_file, args.size_mib)
        size = model_file.stat().st_size
        copy_target = work / "copy.gguf"
        model = [sys.executable, "-m", "modelrunner"]

        def reference() -> float:
            seconds = timed(["sha256sum", str(model_file)]) + timed(["cp", str(model_file), str(copy_target)])
            copy_target.unlink()
            return seconds

        def ours() -> float:
            seconds = timed([*model, "package", "--gguf", str(model_file), "bench:big"], env=daemon.env)
            subprocess.run([*model, "rm", "bench:big"], check=True, stdout=subprocess.DEVNULL, env=daemon.env)
            return seconds

        reference(), ours()  # warm the page cache and the daemon
        ref_times, our_times = [], []
        for _ in range(args.runs):
            ref_times.append(reference())
            our_times.append(ours())
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)

    ref, mine = statistics.median(ref_times), statistics.median(our_times)
    result = {
        "benchmark": "package",
        "file_bytes": size,
        "runs": args.runs,
        "reference": "sha256sum + cp",
        "reference_seconds": ref_times,
        "modelrunner_seconds": our_times,
        "reference_median_s": round(ref, 3),
        "modelrunner_median_s": round(mine, 3),
        "ratio": round(mine / ref, 3),
        "cpus": os.cpu_count(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':24}{'median s':>10}{'MB/s':>10}")
    print(f"{'sha256sum + cp':24}{ref:>10.2f}{size / ref / 1e6:>10.0f}")
    print(f"{'model package':24}{mine:>10.2f}{size / mine / 1e6:>10.0f}")
    print(f"ratio (ours / reference): {mine / ref:.2f}")


if __name__ == "__main__":
    main()
