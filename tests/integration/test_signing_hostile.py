"""Hostile signatures (#24): what a registry or a mirror in the middle can serve instead of a signature.
Each is refused with a clear reason. The model is put in Debian's docker-registry over HTTP by the test,
and the misbehaving answers come from tests/registry.py's RegistryProxy in front of it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

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
from tests.signing_fixtures import OCI, a_model, key, put_manifest, signature_layer, upload


@pytest.fixture
def proxy(signing_registry: Registry) -> Iterator[RegistryProxy]:
    running = RegistryProxy(signing_registry.host).start()
    yield running
    running.stop()


def signature_manifest(registry: Registry, layers: list[dict[str, object]]) -> dict[str, object]:
    return {
        "schemaVersion": 2,
        "mediaType": OCI,
        "config": upload(registry, "team/m", b"{}"),
        "layers": layers,
    }


def test_a_signature_made_for_another_repository_is_refused(signing_registry: Registry) -> None:
    private = key()
    digest = a_model(signing_registry)
    # signed, but for another model name
    payload = make_payload(f"{signing_registry.host}/team/other:v1", digest)
    layers = [signature_layer(signing_registry, private, payload)]
    put_manifest(
        signing_registry, "team/m", signature_tag(digest), signature_manifest(signing_registry, layers)
    )
    with pytest.raises(InvalidSignature, match="another repository"):
        verify_reference(parse_reference(f"{signing_registry.host}/team/m:v1"), [private.public_key()])


def test_one_good_signature_among_bad_ones_verifies(signing_registry: Registry) -> None:
    private, stranger = key(), key()
    digest = a_model(signing_registry)
    reference = parse_reference(f"{signing_registry.host}/team/m:v1")
    layers = [signature_layer(signing_registry, stranger, make_payload(str(reference), digest))]
    put_manifest(
        signing_registry, "team/m", signature_tag(digest), signature_manifest(signing_registry, layers)
    )
    with pytest.raises(InvalidSignature, match="no signature was made by the given key"):
        verify_reference(reference, [private.public_key()])
    sign_reference(reference, private)  # appends to the stranger's manifest, as cosign does
    assert verify_reference(reference, [private.public_key()]).signer == keys.key_id(private.public_key())


def test_a_tag_moved_after_signing_does_not_verify(signing_registry: Registry) -> None:
    private = key()
    reference = parse_reference(f"{signing_registry.host}/team/m:v1")
    a_model(signing_registry, content=b"the signed weights")
    sign_reference(reference, private)
    a_model(signing_registry, content=b"other weights")  # the tag now names an unsigned manifest
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
    signing_registry: Registry, proxy: RegistryProxy, hostile: bytes, problem: str
) -> None:
    digest = a_model(signing_registry)
    proxy.controls.manifests[f"/v2/team/m/manifests/{signature_tag(digest)}"] = (hostile, OCI)
    with pytest.raises(InvalidSignature, match=problem):
        verify_reference(parse_reference(f"{proxy.host}/team/m:v1"), [key().public_key()])


def test_a_payload_of_another_size_than_announced_is_refused(
    signing_registry: Registry, proxy: RegistryProxy
) -> None:
    private = key()
    digest = a_model(signing_registry)
    layer = signature_layer(signing_registry, private, make_payload(f"{proxy.host}/team/m:v1", digest))
    short = {**layer, "size": int(str(layer["size"])) - 1}  # the registry sends more than announced
    proxy.controls.manifests[f"/v2/team/m/manifests/{signature_tag(digest)}"] = (
        json.dumps(signature_manifest(signing_registry, [short])).encode(),
        OCI,
    )
    with pytest.raises(InvalidSignature, match="larger than its manifest says"):
        verify_reference(parse_reference(f"{proxy.host}/team/m:v1"), [private.public_key()])


def test_a_signature_annotation_that_is_not_base64_is_refused(signing_registry: Registry) -> None:
    private = key()
    digest = a_model(signing_registry)
    layer = signature_layer(
        signing_registry, private, make_payload(f"{signing_registry.host}/team/m:v1", digest)
    )
    layer["annotations"] = {SIGNATURE_ANNOTATION: "%%%"}
    put_manifest(
        signing_registry, "team/m", signature_tag(digest), signature_manifest(signing_registry, [layer])
    )
    with pytest.raises(InvalidSignature, match="not base64"):
        verify_reference(parse_reference(f"{signing_registry.host}/team/m:v1"), [private.public_key()])
