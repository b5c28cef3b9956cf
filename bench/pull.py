"""Benchmark `model pull` of a 1 GiB model from a local registry against `cp` of the same bytes, same run.

A generated artifact (one layer of random bytes, DMR's media types) is uploaded to Debian's
`docker-registry`; then, alternating: `cp` of the registry's blob file to a new file in the store's folder
(the aim's reference), the same `cp` followed by `sync FILE` (its fsync: the store fsyncs every blob before
the rename, cp does not), `openssl dgst -sha256` of the blob file (the hash alone at full speed: the floor
of any verified download), `skopeo copy docker://... dir:...` (a second reference), and a pull into an empty
store through the daemon (`POST /models/create`: streamed, hashed, fsynced, verified, renamed).
Page cache: the blob file is cached (warm) for every run, each copy is a new file, and `sync` runs before
each timed run so that no run waits on the writeback of the one before. `pull 2 x half`: a pull of the same
number of bytes in two layers of half the size (fetched, hashed and written at once, one per core). Medians,
throughputs and the ratios pull throughput / reference throughput (aim >= 0.95 against openssl's) and the
two layers' time / the one layer's (aim <= 0.6) are printed, written as JSON, and appended to
bench/RESULTS.md under `## pull`.

    .venv/bin/python bench/pull.py [--size-mib 1024] [--runs 3] [--baseline /tmp/before/src]

With `--baseline SRC` a second daemon runs that version (its `src` first on PYTHONPATH) and its two pulls
are timed alongside (`before: ...` rows): before and after in one run. `--pulls-only` leaves out `cp` and
`skopeo copy`, which write a GiB each between the pulls: on the 2-core VM of 2026-12-02 their writeback and
page-cache churn moved the pull that followed them by up to 2x, more than the changes being measured.
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
TWO = "pull 2 x half"
BEFORE = "before: "  # the same bytes in two layers of half the size, fetched and hashed at once
NAMES = ("cp", "cp + sync", "sha256 (openssl)", "skopeo copy", "model pull", TWO)
COPIES = ("cp", "cp + sync", "skopeo copy")  # left out by --pulls-only


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


def publish_model(
    registry: Registry, work: Path, size: int, layers: int = 1, repository: str = "bench/big"
) -> tuple[str, list[str]]:
    """Upload a model of `layers` layers of `size / layers` random bytes each; returns its reference and
    the layers' digests."""
    layer_size = size // layers
    described = []
    digests = []
    for index in range(layers):
        layer = work / f"weights-{index}.gguf"
        digest = write_random(layer, layer_size)
        upload_blob(registry, repository, digest, layer)
        layer.unlink()
        annotations = {mt.ANNOTATION_FILEPATH: f"weights-{index}.gguf"}
        described.append(
            {"mediaType": mt.GGUF, "digest": digest, "size": layer_size, "annotations": annotations}
        )
        digests.append(digest)
    config = {
        "config": {"format": "gguf", "quantization": "F32", "architecture": "llama", "size": f"{size}B"},
        "descriptor": {"created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "rootfs": {"type": "rootfs", "diff_ids": digests},
    }
    config_bytes = json.dumps(config).encode()
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    upload_blob(registry, repository, config_digest, config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "config": {"mediaType": mt.CONFIG_V01, "digest": config_digest, "size": len(config_bytes)},
        "layers": described,
    }
    httpx.put(
        f"{registry.url}/v2/{repository}/manifests/v1",
        content=json.dumps(manifest).encode(),
        headers={"Content-Type": mt.OCI_MANIFEST},
    ).raise_for_status()
    return f"{registry.host}/{repository}:v1", digests


def pull_through(daemon: Daemon, reference: str) -> None:
    """One pull of `reference` through the daemon's API, as `model pull` asks for it; its last progress
    message must be the success."""
    response = daemon.http(
        "POST",
        "/models/create",
        json={"from": reference},
        headers={"Accept": "application/json"},
        timeout=900,
    )
    last = json.loads(response.text.splitlines()[-1])
    assert last["type"] == "success", last


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "pull.json")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument("--baseline", type=Path, help="the src folder of a version to compare with")
    parser.add_argument("--pulls-only", action="store_true", help="only openssl and the pulls (no copies)")
    args = parser.parse_args()
    names = NAMES + ((BEFORE + "model pull", BEFORE + TWO) if args.baseline else ())
    if args.pulls_only:
        names = tuple(name for name in names if name not in COPIES)

    work = Path(tempfile.mkdtemp(prefix="bench-pull-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    registry = Registry(work / "registry").start()
    daemon = Daemon(work / "home", free_port())
    before = Daemon(work / "home-before", free_port())
    size = args.size_mib * 1024 * 1024
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    try:
        ref, (layer_digest,) = publish_model(registry, work, size)
        two_ref, _ = publish_model(registry, work, size, layers=2, repository="bench/two")
        blob_file = registry.blob_data_path(layer_digest)
        daemon.start()
        if args.baseline:
            os.environ["PYTHONPATH"] = str(args.baseline.resolve())
            before.start()
            del os.environ["PYTHONPATH"]
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

        def pull(reference: str = ref, through: Daemon = daemon) -> None:
            pull_through(through, reference)

        def clean() -> None:
            copy_target.unlink(missing_ok=True)
            shutil.rmtree(work / "skopeo", ignore_errors=True)
            for running in (daemon, before) if args.baseline else (daemon,):
                for model in running.models():
                    running.http("DELETE", f"/models/{model['id']}").raise_for_status()

        runs: dict[str, Callable[[], None]] = {
            "cp": cp,
            "cp + sync": cp_sync,
            "sha256 (openssl)": sha256,
            "skopeo copy": skopeo,
            "model pull": pull,
            TWO: lambda: pull(two_ref),
        }
        if args.baseline:
            runs[BEFORE + "model pull"] = lambda: pull(ref, before)
            runs[BEFORE + TWO] = lambda: pull(two_ref, before)
        runs = {name: run for name, run in runs.items() if name in names}
        pids = {name: daemon.process.pid if daemon.process else None for name in runs}
        for name in runs:
            if name.startswith(BEFORE):
                pids[name] = before.process.pid if before.process else None
        for run in runs.values():  # warm the page cache, the registry and the daemon
            run()
            clean()
        for _ in range(args.runs):
            for name, run in runs.items():
                wall, used = timed(run, pids[name])
                times[name].append(wall)
                cpu[name].append(used)
                clean()
    finally:
        daemon.stop()
        before.stop()
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)

    medians = {name: statistics.median(values) for name, values in times.items()}
    pull_s = medians["model pull"]
    ratios = {
        name: medians[name] / pull_s for name in NAMES if name in medians and name not in ("model pull", TWO)
    }
    two_over_one = medians[TWO] / pull_s
    if args.baseline:
        ratios["before (1 blob)"] = medians[BEFORE + "model pull"] / pull_s
        ratios["before (2 x half)"] = medians[BEFORE + TWO] / medians[TWO]
    result = {
        "benchmark": "pull",
        "layer_bytes": size,
        "runs": args.runs,
        "page_cache": "blob file warm; each copy a new file; sync before each timed run",
        "seconds": times,
        "cpu_seconds": cpu,
        "median_s": {name: round(value, 3) for name, value in medians.items()},
        "pull_throughput_over_reference": {name: round(value, 3) for name, value in ratios.items()},
        "two_blobs_time_over_one": round(two_over_one, 3),
        "aim": "pull throughput >= 0.95 x openssl's; 2 x 512 MiB in <= 0.6 x the time of 1 x 1 GiB",
        "cpus": os.cpu_count(),
        "load_average_after": os.getloadavg(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    table = table_rows(times, cpu, size)
    summary = ", ".join(f"{name} **{ratio:.2f}**" for name, ratio in ratios.items())
    print("\n".join(table))
    print(f"pull throughput / reference throughput: {summary} (aim >= 0.95 against openssl)")
    print(f"two blobs of half the size / one blob, time: {two_over_one:.2f} (aim <= 0.6)")
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.no_record:
        record(args, table, summary, two_over_one)


def record(args: argparse.Namespace, table: list[str], summary: str, two_over_one: float) -> None:
    results = ROOT / "bench" / "RESULTS.md"
    text = results.read_text() if results.exists() else "# Benchmark results\n"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    entry = (
        f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, load average after the run "
        f"{load}, {args.size_mib} MiB layer, median of {args.runs} runs: `.venv/bin/python bench/pull.py "
        f"--size-mib {args.size_mib} --runs {args.runs}`\n\n"
        + "\n".join(table)
        + f"\n\npull throughput / reference throughput: {summary} (aim >= 0.95 against openssl); two "
        f"blobs of half the size / one blob, time: **{two_over_one:.2f}** (aim <= 0.6)\n"
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
