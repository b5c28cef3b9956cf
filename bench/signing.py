"""Benchmark what signature verification adds to a pull, to a load and to `model verify --deep`, each
against a reference measured in the same run, alternating, on Debian's `docker-registry` on loopback.

1. The signature check alone (`--runs` times each, medians): one GET of the model's manifest (what every
   pull does anyway: the reference), the pull's signature check (referrers GET, `.sig` manifest GET, the
   payload blob GET, ECDSA, payload parse: signing/enforce.py's work), and its ECDSA + parse part.
2. A 1 GiB model (`--size-mib`), signed, pulled through the daemon (`POST /models/create`) into an empty
   store `--rounds` times without a trust policy and with an `enforce` rule for its key, alternating (wall
   and daemon CPU seconds, medians, ratio); then, on the verified copy, the check before a load
   (signing/record.py check_before_load: policy read, the store's record, a stat per blob) and
   `model verify --deep`'s work (signing/local.py verify_stored: the kept signature, every blob hashed
   again) against `openssl dgst -sha256` of the same blob file. Page cache warm for every run.

    .venv/bin/python bench/signing.py [--runs 200] [--size-mib 1024] [--rounds 5]
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
from collections.abc import Callable
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.pull import publish_model, pull_through  # noqa: E402
from bench.timing import timed  # noqa: E402

from modelrunner.distribution.registry import RegistryClient  # noqa: E402
from modelrunner.reference import parse_reference  # noqa: E402
from modelrunner.signing import keys  # noqa: E402
from modelrunner.signing.local import verify_stored  # noqa: E402
from modelrunner.signing.policy import Rule, policy_path, save_rules  # noqa: E402
from modelrunner.signing.record import check_before_load  # noqa: E402
from modelrunner.signing.registry import (  # noqa: E402
    read_signatures,
    resolve_digest,
    sign_reference,
    verify_signatures,
)
from modelrunner.store.store import ModelStore  # noqa: E402
from tests.daemon import Daemon, free_port  # noqa: E402
from tests.registry import Registry  # noqa: E402

OCI = "application/vnd.oci.image.manifest.v1+json"


def upload(registry: Registry, data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    started = httpx.post(f"{registry.url}/v2/bench/m/blobs/uploads/")
    location = httpx.URL(registry.url).join(started.headers["location"])
    httpx.put(location.copy_add_param("digest", digest), content=data).raise_for_status()
    return {"mediaType": "application/octet-stream", "size": len(data), "digest": digest}


def median_ms(run: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def signature_check(registry: Registry, runs: int) -> None:
    manifest = {"schemaVersion": 2, "mediaType": OCI, "config": upload(registry, b"{}")}
    manifest["layers"] = [upload(registry, b"weights")]
    httpx.put(
        f"{registry.url}/v2/bench/m/manifests/v1",
        content=json.dumps(manifest).encode(),
        headers={"Content-Type": OCI},
    ).raise_for_status()
    reference = parse_reference(f"{registry.host}/bench/m:v1")
    private = ec.generate_private_key(ec.SECP256R1())
    with RegistryClient(reference.registry) as client:
        sign_reference(reference, private, client=client)
        digest = resolve_digest(client, reference)
        public = [private.public_key()]
        reference_ms = median_ms(lambda: client.get_manifest("bench/m", "v1"), runs)
        check_ms = median_ms(
            lambda: verify_signatures(read_signatures(client, "bench/m", digest), reference, digest, public),
            runs,
        )
        signatures = read_signatures(client, "bench/m", digest)
        crypto_ms = median_ms(lambda: verify_signatures(signatures, reference, digest, public), runs)
    print(f"signature check alone, {runs} runs each, medians")
    print(f"| {'what':<48} | {'median ms':>9} |")
    print(f"|{'-' * 50}|{'-' * 11}|")
    print(f"| {'manifest GET (reference: every pull does it)':<48} | {reference_ms:9.3f} |")
    print(f"| {'signature check on pull (3 GETs + verify)':<48} | {check_ms:9.3f} |")
    print(f"| {'of which ECDSA verify + payload parse':<48} | {crypto_ms:9.3f} |")
    print(f"ratio check / manifest GET: {check_ms / reference_ms:.2f}")


def timed_here(run: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `run()` in this process (bench.timing.timed counts children's)."""
    os.sync()
    cpu, start = time.process_time(), time.perf_counter()
    run()
    return time.perf_counter() - start, time.process_time() - cpu


def row(name: str, values: list[float], cpu: list[float] | None = None) -> str:
    runs = " ".join(
        f"{v:.2f}" + (f" ({c:.2f})" if cpu else "") for v, c in zip(values, cpu or values, strict=True)
    )
    used = f"{statistics.median(cpu):8.3f}" if cpu else f"{'':8}"
    return f"| {name:<34} | {statistics.median(values):8.3f} | {used} | {runs} |"


def pull_and_load(work: Path, registry: Registry, size_mib: int, rounds: int) -> None:
    ref, [layer_digest] = publish_model(registry, work, size_mib * 1024 * 1024)
    reference = parse_reference(ref)
    private = ec.generate_private_key(ec.SECP256R1())
    sign_reference(reference, private)
    pem = keys.public_pem(private.public_key()).decode()
    daemon = Daemon(work / "home", free_port())
    policy = policy_path(daemon.home)
    enforce = [Rule(reference.name, (pem,), "enforce")]
    try:
        daemon.start()
        pid = daemon.process.pid if daemon.process else None

        def pull() -> None:
            pull_through(daemon, ref)

        def delete() -> None:
            daemon.http("DELETE", f"/models/{ref}").raise_for_status()

        runs: dict[str, tuple[list[float], list[float]]] = {
            "pull, no policy": ([], []),
            "pull, enforce": ([], []),
        }
        for round_ in range(rounds + 1):  # round 0 warms the page cache, the registry and the daemon
            for name, (walls, cpus) in runs.items():
                if name.endswith("enforce"):
                    save_rules(policy, enforce)
                else:
                    policy.unlink(missing_ok=True)
                wall, used = timed(pull, pid)
                if round_:
                    walls.append(wall)
                    cpus.append(used)
                if round_ < rounds or not name.endswith("enforce"):
                    delete()
        os.environ["MODEL_RUNNER_HOME"] = str(daemon.home)  # the policy check_before_load reads
        store = ModelStore(daemon.store_root)
        model = store.get(ref, by_name=True)
        load_checks = [timed_here(lambda: check_before_load(store, model))[0] for _ in range(200)]
        openssl_command = ["openssl", "dgst", "-sha256", str(store.layout.blob_path(layer_digest))]
        deep: tuple[list[float], list[float]] = ([], [])
        openssl: tuple[list[float], list[float]] = ([], [])
        for round_ in range(rounds + 1):
            wall, used = timed_here(lambda: verify_stored(store, ref, [pem], deep=True))
            wall2, used2 = timed(
                lambda: subprocess.run(openssl_command, check=True, stdout=subprocess.DEVNULL)
            )
            if round_:
                deep[0].append(wall)
                deep[1].append(used)
                openssl[0].append(wall2)
                openssl[1].append(used2)
    finally:
        daemon.stop()
    (plain, plain_cpu), (signed, signed_cpu) = runs.values()
    print(f"\n{size_mib} MiB model, {rounds} rounds, medians (wall s, CPU s: the daemon's for a pull)")
    print(f"| {'what':<34} | {'wall s':>8} | {'CPU s':>8} | runs, wall s (CPU s) |")
    print(f"|{'-' * 36}|{'-' * 10}|{'-' * 10}|--------------|")
    print(row("pull, no trust policy", plain, plain_cpu))
    print(row("pull, enforce rule (verified)", signed, signed_cpu))
    print(row("model verify --deep (in-process)", *deep))
    print(row("openssl dgst -sha256 of the blob", *openssl))
    ratio = statistics.median(signed) / statistics.median(plain)
    cpu_added = statistics.median(signed_cpu) - statistics.median(plain_cpu)
    print(f"pull with / without the check: {ratio:.3f} (wall), daemon CPU added {cpu_added:+.3f} s")
    print(f"--deep / openssl: {statistics.median(deep[0]) / statistics.median(openssl[0]):.2f} (wall)")
    print(
        f"check before a load (policy read, record, stat per blob), 200 runs: median "
        f"{statistics.median(load_checks) * 1000:.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="runs of the signature check alone")
    parser.add_argument("--size-mib", type=int, default=1024, help="size of the pulled model (0: skip)")
    parser.add_argument("--rounds", type=int, default=5, help="pulls with and without the policy")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-signing-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    registry = Registry(work / "registry").start()
    try:
        signature_check(registry, args.runs)
        if args.size_mib:
            pull_and_load(work, registry, args.size_mib, args.rounds)
    finally:
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
