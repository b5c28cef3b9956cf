"""Benchmark `model pull` against `skopeo copy` of the same 1 GiB model from a local registry, same run.

A generated artifact (one layer of random bytes, DMR's media types) is uploaded to Debian's
`docker-registry`; then, alternating, `skopeo copy docker://... dir:...` and a pull into an empty store
through the daemon (`POST /models/create`, which streams, hashes and verifies every blob). Medians and the
ratio ours / reference (lower is better, aim <= 1.0) are printed, written as JSON, and appended to
bench/RESULTS.md under `## pull`.

    .venv/bin/python bench/pull.py [--size-mib 1024] [--runs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from modelrunner.artifact import mediatypes as mt  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.registry import Registry  # noqa: E402

CHUNK = 16 * 1024 * 1024


def write_random(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as handle:
        left = size
        while left:
            block = os.urandom(min(CHUNK, left))
            digest.update(block)
            handle.write(block)
            left -= len(block)
    return "sha256:" + digest.hexdigest()


def file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            yield block


def upload_blob(registry: Registry, repository: str, digest: str, content: bytes | Path) -> None:
    start = httpx.post(f"{registry.url}/v2/{repository}/blobs/uploads/")
    start.raise_for_status()
    location = start.headers["location"]
    location += ("&" if "?" in location else "?") + f"digest={digest}"
    size = content.stat().st_size if isinstance(content, Path) else len(content)
    body = file_chunks(content) if isinstance(content, Path) else content
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
    httpx.put(location, content=body, headers=headers, timeout=600).raise_for_status()


def publish_model(registry: Registry, work: Path, size: int) -> str:
    layer = work / "weights.gguf"
    layer_digest = write_random(layer, size)
    config = {
        "config": {"format": "gguf", "quantization": "F32", "architecture": "llama", "size": f"{size}B"},
        "descriptor": {"created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "rootfs": {"type": "rootfs", "diff_ids": [layer_digest]},
    }
    config_bytes = json.dumps(config).encode()
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    upload_blob(registry, "bench/big", layer_digest, layer)
    upload_blob(registry, "bench/big", config_digest, config_bytes)
    annotations = {mt.ANNOTATION_FILEPATH: "weights.gguf"}
    manifest = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "config": {"mediaType": mt.CONFIG_V01, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": mt.GGUF, "digest": layer_digest, "size": size, "annotations": annotations}],
    }
    httpx.put(
        f"{registry.url}/v2/bench/big/manifests/v1",
        content=json.dumps(manifest).encode(),
        headers={"Content-Type": mt.OCI_MANIFEST},
    ).raise_for_status()
    layer.unlink()
    return f"{registry.host}/bench/big:v1"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "pull.json")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-pull-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    registry = Registry(work / "registry").start()
    daemon = Daemon(work / "home", free_port())
    size = args.size_mib * 1024 * 1024
    try:
        ref = publish_model(registry, work, size)
        daemon.start()

        def reference() -> float:
            target = work / "skopeo-copy"
            start = time.perf_counter()
            subprocess.run(
                ["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}", f"dir:{target}"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            seconds = time.perf_counter() - start
            shutil.rmtree(target)
            return seconds

        def ours() -> float:
            start = time.perf_counter()
            response = daemon.http(
                "POST",
                "/models/create",
                json={"from": ref},
                headers={"Accept": "application/json"},
                timeout=900,
            )
            seconds = time.perf_counter() - start
            last = json.loads(response.text.splitlines()[-1])
            assert last["type"] == "success", last
            daemon.http("DELETE", f"/models/{ref}")
            return seconds

        reference(), ours()  # warm the page cache, the registry and the daemon
        ref_times, our_times = [], []
        for _ in range(args.runs):
            ref_times.append(reference())
            our_times.append(ours())
    finally:
        daemon.stop()
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)

    ref_median, our_median = statistics.median(ref_times), statistics.median(our_times)
    ratio = our_median / ref_median
    result = {
        "benchmark": "pull",
        "layer_bytes": size,
        "runs": args.runs,
        "reference": "skopeo copy docker:// -> dir:",
        "reference_seconds": ref_times,
        "modelrunner_seconds": our_times,
        "reference_median_s": round(ref_median, 3),
        "modelrunner_median_s": round(our_median, 3),
        "ratio": round(ratio, 3),
        "cpus": os.cpu_count(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    table = [
        f"| {'':24} | {'median s':>9} | {'MB/s':>6} |",
        f"|{'-' * 26}|{'-' * 11}|{'-' * 8}|",
        f"| {'skopeo copy':24} | {ref_median:>9.2f} | {size / ref_median / 1e6:>6.0f} |",
        f"| {'model pull':24} | {our_median:>9.2f} | {size / our_median / 1e6:>6.0f} |",
    ]
    print("\n".join(table))
    print(f"ratio (ours / reference): {ratio:.2f}")
    if not args.no_record:
        record(args, table, ratio)


def record(args: argparse.Namespace, table: list[str], ratio: float) -> None:
    results = ROOT / "bench" / "RESULTS.md"
    text = results.read_text() if results.exists() else "# Benchmark results\n"
    entry = (
        f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, {args.size_mib} MiB layer, "
        f"median of {args.runs} runs: `.venv/bin/python bench/pull.py --size-mib {args.size_mib} "
        f"--runs {args.runs}`\n\n"
        + "\n".join(table)
        + f"\n\nratio (model pull / skopeo copy): **{ratio:.2f}**\n"
    )
    if "\n## pull\n" not in text:
        text = (
            text.rstrip("\n") + "\n\n## pull\n\nEach pull goes into an empty store: streamed, hashed while "
        )
        text += "written, verified, renamed; skopeo copies the same blobs to a directory.\n"
        results.write_text(text + entry)
        return
    head, _, tail = text.partition("\n## pull\n")
    section, sep, rest = tail.partition("\n## ")
    results.write_text(
        head + "\n## pull\n" + section.rstrip("\n") + "\n" + entry + (("\n## " + rest) if sep else "")
    )


if __name__ == "__main__":
    main()
