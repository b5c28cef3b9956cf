"""Benchmark what signature verification adds to a pull and to a load, against a reference in the same run.

Against Debian's `docker-registry` on loopback: a model manifest is pushed and signed (cosign's `.sig` tag);
then, alternating, N times each: one GET of the model's manifest (what every pull does anyway: the
reference), the pull's signature check (referrers GET, `.sig` manifest GET, the payload blob GET, ECDSA,
payload parse: signing/enforce.py's work), and the check before a load (policy file read, the store's
record, a stat per blob: signing/record.py) for a model of N_BLOBS files. Verification hashes no blob.

    .venv/bin/python bench/signing.py [--runs 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from modelrunner.distribution.registry import RegistryClient
from modelrunner.reference import parse_reference
from modelrunner.signing import keys
from modelrunner.signing.registry import (
    read_signatures,
    resolve_digest,
    sign_reference,
    verify_signatures,
)
from tests.registry import Registry

OCI = "application/vnd.oci.image.manifest.v1+json"


def upload(registry: Registry, data: bytes) -> dict[str, object]:
    import hashlib

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        registry = Registry(Path(folder) / "registry").start()
        try:
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
                reference_ms = median_ms(lambda: client.get_manifest("bench/m", "v1"), args.runs)
                check_ms = median_ms(
                    lambda: verify_signatures(
                        read_signatures(client, "bench/m", digest), reference, digest, public
                    ),
                    args.runs,
                )
                signatures = read_signatures(client, "bench/m", digest)
                crypto_ms = median_ms(
                    lambda: verify_signatures(signatures, reference, digest, public), args.runs
                )
                key_id = keys.key_id(private.public_key())
        finally:
            registry.stop()
    print(f"| {'what':<48} | {'median ms':>9} |")
    print(f"|{'-' * 50}|{'-' * 11}|")
    print(f"| {'manifest GET (reference: every pull does it)':<48} | {reference_ms:9.3f} |")
    print(f"| {'signature check on pull (3 GETs + verify)':<48} | {check_ms:9.3f} |")
    print(f"| {'of which ECDSA verify + payload parse':<48} | {crypto_ms:9.3f} |")
    print(f"ratio check / manifest GET: {check_ms / reference_ms:.2f}; signer {key_id[:19]}")


if __name__ == "__main__":
    main()
