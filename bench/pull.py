"""Benchmark `model pull` of a 1 GiB model from a local registry against `cp` of the same bytes, same run.

A generated artifact (one layer of random bytes, DMR's media types) is uploaded to Debian's
`docker-registry`; then, alternating: `cp` of the registry's blob file to a new file in the store's folder
(the aim's reference), the same `cp` followed by `sync FILE` (its fsync: the store fsyncs every blob before
the rename, cp does not), `openssl dgst -sha256` of the blob file (the hash alone at full speed: the floor
of any verified download), `skopeo copy docker://... dir:...` (a second reference), and a pull into an empty
store through the daemon (`POST /models/create`: streamed, hashed, fsynced, verified, renamed).
Page cache: the blob file is cached (warm) for every run, each copy is a new file, and `sync` runs before
each timed run so that no run waits on the writeback of the one before. Medians, throughputs and the ratios
pull throughput / reference throughput (aim >= 0.9 against cp) are printed, written as JSON, and appended
to bench/RESULTS.md under `## pull`.

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
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.timing import table_rows, timed  # noqa: E402

from modelrunner.artifact import mediatypes as mt  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.registry import Registry  # noqa: E402

CHUNK = 16 * 1024 * 1024
NAMES = ("cp", "cp + sync", "sha256 (openssl)", "skopeo copy", "model pull")


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


def publish_model(registry: Registry, work: Path, size: int) -> tuple[str, str]:
    """Upload a one-layer model of `size` random bytes; returns its reference and the layer's digest."""
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
    return f"{registry.host}/bench/big:v1", layer_digest


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
    times: dict[str, list[float]] = {name: [] for name in NAMES}
    cpu: dict[str, list[float]] = {name: [] for name in NAMES}
    try:
        ref, layer_digest = publish_model(registry, work, size)
        blob_file = registry.blob_data_path(layer_digest)
        daemon.start()
        copy_target = daemon.store_root / "bench-cp-copy"  # the store's own folder and file system

        def cp() -> None:
            subprocess.run(["cp", str(blob_file), str(copy_target)], check=True)

        def cp_sync() -> None:
            cp()
            subprocess.run(["sync", str(copy_target)], check=True)

        def sha256() -> None:
            subprocess.run(
                ["openssl", "dgst", "-sha256", str(blob_file)], check=True, stdout=subprocess.DEVNULL
            )

        def skopeo() -> None:
            subprocess.run(
                ["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}", f"dir:{work / 'skopeo'}"],
                check=True,
                stdout=subprocess.DEVNULL,
            )

        def pull() -> None:
            response = daemon.http(
                "POST",
                "/models/create",
                json={"from": ref},
                headers={"Accept": "application/json"},
                timeout=900,
            )
            last = json.loads(response.text.splitlines()[-1])
            assert last["type"] == "success", last

        def clean() -> None:
            copy_target.unlink(missing_ok=True)
            shutil.rmtree(work / "skopeo", ignore_errors=True)
            if daemon.models():
                daemon.http("DELETE", f"/models/{ref}").raise_for_status()

        runs: dict[str, Callable[[], None]] = {
            "cp": cp,
            "cp + sync": cp_sync,
            "sha256 (openssl)": sha256,
            "skopeo copy": skopeo,
            "model pull": pull,
        }
        for run in runs.values():  # warm the page cache, the registry and the daemon
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
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)

    medians = {name: statistics.median(values) for name, values in times.items()}
    pull_s = medians["model pull"]
    ratios = {name: medians[name] / pull_s for name in NAMES if name != "model pull"}
    result = {
        "benchmark": "pull",
        "layer_bytes": size,
        "runs": args.runs,
        "page_cache": "blob file warm; each copy a new file; sync before each timed run",
        "seconds": times,
        "cpu_seconds": cpu,
        "median_s": {name: round(value, 3) for name, value in medians.items()},
        "pull_throughput_over_reference": {name: round(value, 3) for name, value in ratios.items()},
        "aim": "pull throughput >= 0.9 x cp",
        "cpus": os.cpu_count(),
        "load_average_after": os.getloadavg(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    table = table_rows(times, cpu, size)
    summary = ", ".join(f"{name} **{ratio:.2f}**" for name, ratio in ratios.items())
    print("\n".join(table))
    print(f"pull throughput / reference throughput: {summary} (aim >= 0.9 against cp)")
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.no_record:
        record(args, table, summary)


def record(args: argparse.Namespace, table: list[str], summary: str) -> None:
    results = ROOT / "bench" / "RESULTS.md"
    text = results.read_text() if results.exists() else "# Benchmark results\n"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    entry = (
        f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, load average after the run "
        f"{load}, {args.size_mib} MiB layer, median of {args.runs} runs: `.venv/bin/python bench/pull.py "
        f"--size-mib {args.size_mib} --runs {args.runs}`\n\n"
        + "\n".join(table)
        + f"\n\npull throughput / reference throughput: {summary} (aim >= 0.9 against cp)\n"
    )
    if "\n## pull\n" not in text:
        results.write_text(text.rstrip("\n") + "\n\n## pull\n" + entry)
        return
    head, _, tail = text.partition("\n## pull\n")
    section, sep, rest = tail.partition("\n## ")
    results.write_text(
        head + "\n## pull\n" + section.rstrip("\n") + "\n" + entry + (("\n## " + rest) if sep else "")
    )


if __name__ == "__main__":
    main()
