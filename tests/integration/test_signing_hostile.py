"""Hostile signatures (#24): what a registry or a mirror in the middle can serve instead of a signature.
Each is refused with a clear reason. The model is put in Debian's docker-registry over HTTP by the test,
and the misbehaving answers come from tests/registry.py's RegistryProxy in front of it."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from modelrunner.reference import parse_reference
from modelrunner.signing import keys
from modelrunner.signing.payload import InvalidSignature, make_payload
from modelrunner.signing.registry import (
    SIGNATURE_ANNOTATION,
    SIMPLE_SIGNING,
    sign_reference,
    signature_tag,
    verify_reference,
)
from tests.registry import Registry, RegistryProxy

OCI = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    running = Registry(tmp_path / "registry").start()
    yield running
    running.stop()


@pytest.fixture
def proxy(registry: Registry) -> Iterator[RegistryProxy]:
    running = RegistryProxy(registry.host).start()
    yield running
    running.stop()


def upload(registry: Registry, repository: str, data: bytes) -> dict[str, object]:
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


def signature_manifest(registry: Registry, layers: list[dict[str, object]]) -> dict[str, object]:
    return {
        "schemaVersion": 2,
        "mediaType": OCI,
        "config": upload(registry, "team/m", b"{}"),
        "layers": layers,
    }


def test_a_signature_made_for_another_repository_is_refused(registry: Registry) -> None:
    private = key()
    digest = a_model(registry)
    payload = make_payload(f"{registry.host}/team/other:v1", digest)  # signed, but for another model name
    layers = [signature_layer(registry, private, payload)]
    put_manifest(registry, "team/m", signature_tag(digest), signature_manifest(registry, layers))
    with pytest.raises(InvalidSignature, match="another repository"):
        verify_reference(parse_reference(f"{registry.host}/team/m:v1"), [private.public_key()])


def test_one_good_signature_among_bad_ones_verifies(registry: Registry) -> None:
    private, stranger = key(), key()
    digest = a_model(registry)
    reference = parse_reference(f"{registry.host}/team/m:v1")
    layers = [signature_layer(registry, stranger, make_payload(str(reference), digest))]
    put_manifest(registry, "team/m", signature_tag(digest), signature_manifest(registry, layers))
    with pytest.raises(InvalidSignature, match="no signature was made by the given key"):
        verify_reference(reference, [private.public_key()])
    sign_reference(reference, private)  # appends to the stranger's manifest, as cosign does
    assert verify_reference(reference, [private.public_key()]).signer == keys.key_id(private.public_key())


def test_a_tag_moved_after_signing_does_not_verify(registry: Registry) -> None:
    private = key()
    reference = parse_reference(f"{registry.host}/team/m:v1")
    a_model(registry, content=b"the signed weights")
    sign_reference(reference, private)
    a_model(registry, content=b"other weights")  # the tag now names an unsigned manifest
    with pytest.raises(InvalidSignature, match="is not signed"):
        verify_reference(reference, [private.public_key()])


@pytest.mark.parametrize(
    ("hostile", "problem"),
    [
        (b'{"schemaVersion": 2, "layers": [', "not JSON"),  # truncated
        (b"{" + b" " * (300 * 1024) + b"}", "too large"),  # oversized
        (b"x" * (5 * 1024 * 1024), "too large"),  # beyond the client's manifest cap
        (json.dumps({"schemaVersion": 2}).encode(), "no layers"),
        (json.dumps({"layers": [{}] * 65}).encode(), "more than 64 signatures"),
        (
            json.dumps({"layers": [{"mediaType": SIMPLE_SIGNING, "digest": "md5:x", "size": 1}]}).encode(),
            "malformed",
        ),
    ],
)
def test_a_hostile_signature_manifest_is_refused(
    registry: Registry, proxy: RegistryProxy, hostile: bytes, problem: str
) -> None:
    digest = a_model(registry)
    proxy.controls.manifests[f"/v2/team/m/manifests/{signature_tag(digest)}"] = (hostile, OCI)
    with pytest.raises(InvalidSignature, match=problem):
        verify_reference(parse_reference(f"{proxy.host}/team/m:v1"), [key().public_key()])


def test_a_payload_of_another_size_than_announced_is_refused(
    registry: Registry, proxy: RegistryProxy
) -> None:
    private = key()
    digest = a_model(registry)
    layer = signature_layer(registry, private, make_payload(f"{proxy.host}/team/m:v1", digest))
    short = {**layer, "size": int(str(layer["size"])) - 1}  # the registry sends more than announced
    proxy.controls.manifests[f"/v2/team/m/manifests/{signature_tag(digest)}"] = (
        json.dumps(signature_manifest(registry, [short])).encode(),
        OCI,
    )
    with pytest.raises(InvalidSignature, match="larger than its manifest says"):
        verify_reference(parse_reference(f"{proxy.host}/team/m:v1"), [private.public_key()])


def test_a_signature_annotation_that_is_not_base64_is_refused(registry: Registry) -> None:
    private = key()
    digest = a_model(registry)
    layer = signature_layer(registry, private, make_payload(f"{registry.host}/team/m:v1", digest))
    layer["annotations"] = {SIGNATURE_ANNOTATION: "%%%"}
    put_manifest(registry, "team/m", signature_tag(digest), signature_manifest(registry, [layer]))
    with pytest.raises(InvalidSignature, match="not base64"):
        verify_reference(parse_reference(f"{registry.host}/team/m:v1"), [private.public_key()])
