"""What the signing tests (tests/integration/test_signing*.py) share, a plugin in tests/conftest.py's
`pytest_plugins`: the fixtures `signing_registry`, `referrers_registry` and `cosign_password` by parameter
name, and plain helpers to import. No fixture here is autouse: a plugin's would apply to every test, so a
module that wants COSIGN_PASSWORD set says `pytestmark = pytest.mark.usefixtures("cosign_password")`."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from modelrunner.signing import keys
from modelrunner.signing.registry import SIGNATURE_ANNOTATION, SIMPLE_SIGNING
from tests.daemon import Daemon
from tests.models import write_tiny_gguf
from tests.registry import Registry, RegistryProxy

PASSWORD = "correct horse"
OCI = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture
def signing_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """Debian's docker-registry over HTTP; the test's Docker config is its own and empty: no credentials."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    running = Registry(tmp_path / "registry").start()
    yield running
    running.stop()


@pytest.fixture
def referrers_registry(signing_registry: Registry) -> Iterator[RegistryProxy]:
    """`signing_registry` behind a proxy that serves OCI 1.1's referrers API (tests/referrers.py)."""
    running = RegistryProxy(signing_registry.host)
    running.controls.serve_referrers = True
    running.start()
    yield running
    running.stop()


@pytest.fixture
def cosign_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSIGN_PASSWORD", PASSWORD)


def keygen(daemon: Daemon, prefix: Path) -> tuple[Path, Path]:
    daemon.cli("trust", "keygen", str(prefix))
    return prefix.with_suffix(".key"), prefix.with_suffix(".pub")


def pushed(
    daemon: Daemon, registry: Registry, tmp_path: Path, name: str = "team/tiny:v1", seed: int = 0
) -> str:
    ref = f"{registry.host}/{name}"
    gguf = write_tiny_gguf(tmp_path / f"tiny-{seed}.gguf", seed=seed)
    daemon.cli("package", "--gguf", str(gguf), "--push", ref)
    return ref


def upload(registry: Registry, repository: str, data: bytes) -> dict[str, object]:
    """A blob pushed to the registry: its descriptor."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    started = httpx.post(f"{registry.url}/v2/{repository}/blobs/uploads/")
    location = httpx.URL(registry.url).join(started.headers["location"])
    httpx.put(location.copy_add_param("digest", digest), content=data).raise_for_status()
    return {"mediaType": "application/octet-stream", "size": len(data), "digest": digest}


def put_manifest(registry: Registry, repository: str, tag: str, manifest: dict[str, object]) -> str:
    body = json.dumps(manifest).encode()
    response = httpx.put(
        f"{registry.url}/v2/{repository}/manifests/{tag}", content=body, headers={"Content-Type": OCI}
    )
    response.raise_for_status()
    return "sha256:" + hashlib.sha256(body).hexdigest()


def a_model(registry: Registry, tag: str = "v1", content: bytes = b"weights") -> str:
    """A small manifest in team/m: what is signed is its digest, whatever it holds."""
    config = upload(registry, "team/m", b"{}")
    layer = upload(registry, "team/m", content)
    return put_manifest(
        registry, "team/m", tag, {"schemaVersion": 2, "mediaType": OCI, "config": config, "layers": [layer]}
    )


def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def signature_layer(
    registry: Registry, private: ec.EllipticCurvePrivateKey, payload: bytes
) -> dict[str, object]:
    layer = upload(registry, "team/m", payload)
    signature = base64.b64encode(keys.sign(private, payload)).decode()
    return {**layer, "mediaType": SIMPLE_SIGNING, "annotations": {SIGNATURE_ANNOTATION: signature}}
