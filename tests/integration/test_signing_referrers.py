"""#24, OCI 1.1 referrers: where the registry serves `GET /v2/<name>/referrers/<digest>`, a signature is a
referrer of the model's manifest (cosign's `--registry-referrers-mode=oci-1-1` layout), else the `.sig`
tag; verifying reads referrers first, then the tag. Debian's docker-registry has no referrers API, so the
registry that serves one is tests/registry.py's RegistryProxy in front of it (tests/referrers.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from modelrunner.reference import parse_reference
from modelrunner.signing import keys
from modelrunner.signing.payload import InvalidSignature, make_payload
from modelrunner.signing.referrers import SIGNATURE_ARTIFACT_TYPE
from modelrunner.signing.registry import sign_reference, signature_tag, verify_reference
from tests.daemon import Daemon
from tests.models import write_tiny_gguf
from tests.registry import Registry, RegistryProxy
from tests.signing_fixtures import OCI, a_model, key, keygen, signature_layer

pytestmark = pytest.mark.usefixtures("cosign_password")
INDEX = "application/vnd.oci.image.index.v1+json"


def referrers(proxy: RegistryProxy, digest: str) -> list[dict[str, object]]:
    response = httpx.get(f"http://{proxy.host}/v2/team/m/referrers/{digest}")
    assert response.headers["content-type"] == INDEX
    return list(response.json()["manifests"])


def tag_exists(registry: Registry, repository: str, tag: str) -> bool:
    response = httpx.head(f"{registry.url}/v2/{repository}/manifests/{tag}", headers={"Accept": OCI})
    return response.status_code == 200


def test_sign_stores_a_referrer_where_the_registry_serves_them(
    signing_registry: Registry, referrers_registry: RegistryProxy
) -> None:
    private = key()
    digest = a_model(signing_registry)
    reference = parse_reference(f"{referrers_registry.host}/team/m:v1")
    sign_reference(reference, private)
    [listed] = referrers(referrers_registry, digest)
    assert listed["artifactType"] == SIGNATURE_ARTIFACT_TYPE
    assert not tag_exists(signing_registry, "team/m", signature_tag(digest))  # no .sig tag beside it
    manifest = httpx.get(
        f"{signing_registry.url}/v2/team/m/manifests/{listed['digest']}", headers={"Accept": OCI}
    )
    document = manifest.json()
    assert document["subject"]["digest"] == digest
    assert document["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    assert document["layers"][0]["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    verified = verify_reference(reference, [private.public_key()])
    assert verified.signer == keys.key_id(private.public_key())


def test_verify_falls_back_to_the_tag(signing_registry: Registry, referrers_registry: RegistryProxy) -> None:
    """Signed where there was no referrers API (the `.sig` tag), verified where there is one."""
    private = key()
    digest = a_model(signing_registry)
    sign_reference(parse_reference(f"{referrers_registry.host}/team/m:v1"), private)
    assert referrers(referrers_registry, digest)  # signed as a referrer; now the tag too:
    referrers_registry.controls.serve_referrers = False
    sign_reference(parse_reference(f"{referrers_registry.host}/team/m:v1"), private)
    assert tag_exists(signing_registry, "team/m", signature_tag(digest))
    referrers_registry.controls.serve_referrers = True
    referrers_registry.referrers = type(referrers_registry.referrers)()  # the referrers are gone
    assert referrers(referrers_registry, digest) == []
    reference = parse_reference(f"{referrers_registry.host}/team/m:v1")
    assert verify_reference(reference, [private.public_key()]).digest == digest


def test_model_sign_verify_and_an_enforced_pull_with_referrers(
    daemon: Daemon, signing_registry: Registry, referrers_registry: RegistryProxy, tmp_path: Path
) -> None:
    private, public = keygen(daemon, tmp_path / "cosign")
    ref = f"{referrers_registry.host}/team/m:v1"
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "t.gguf", seed=21)), "--push", ref)
    daemon.cli("sign", "--key", str(private), ref)
    digest = daemon.models()[0]["id"]
    assert len(referrers(referrers_registry, digest)) == 1
    assert not tag_exists(signing_registry, "team/m", signature_tag(digest))
    assert daemon.cli("verify", ref, "--key", str(public)).returncode == 0
    daemon.cli("rm", ref)
    daemon.cli("trust", "set", f"{referrers_registry.host}/team/*", "--key", str(public))
    daemon.cli("pull", ref)  # enforce: verified from the referrer
    assert daemon.cli("verify", "--local", ref, "--key", str(public)).returncode == 0


# --- hostile referrers --------------------------------------------------------------------------------------


def serve_index(proxy: RegistryProxy, digest: str, manifests: list[dict[str, object]]) -> None:
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}
    proxy.controls.manifests[f"/v2/team/m/referrers/{digest}"] = (json.dumps(index).encode(), INDEX)


def signature_entry(digest: str) -> dict[str, object]:
    return {"mediaType": OCI, "digest": digest, "size": 100, "artifactType": SIGNATURE_ARTIFACT_TYPE}


def manifest_gets(proxy: RegistryProxy) -> int:
    return sum(1 for method, path in proxy.requests if method == "GET" and "/manifests/sha256:" in path)


def test_a_referrer_loop_is_refused(signing_registry: Registry, referrers_registry: RegistryProxy) -> None:
    digest = a_model(signing_registry)
    serve_index(referrers_registry, digest, [signature_entry(digest)])  # the model lists itself
    with pytest.raises(InvalidSignature, match="a loop"):
        verify_reference(parse_reference(f"{referrers_registry.host}/team/m:v1"), [key().public_key()])


def test_hundreds_of_referrers_are_bounded_work(
    signing_registry: Registry, referrers_registry: RegistryProxy
) -> None:
    digest = a_model(signing_registry)
    reference = parse_reference(f"{referrers_registry.host}/team/m:v1")
    fake = ["sha256:" + hashlib.sha256(str(i).encode()).hexdigest() for i in range(300)]
    serve_index(referrers_registry, digest, [signature_entry(d) for d in fake])
    with pytest.raises(InvalidSignature, match="more than 64 signature referrers"):
        verify_reference(reference, [key().public_key()])
    assert manifest_gets(referrers_registry) == 0  # refused from the index alone
    others = [{**signature_entry(d), "artifactType": "application/spdx+json"} for d in fake]
    serve_index(referrers_registry, digest, others)  # SBOMs and such: never fetched
    with pytest.raises(InvalidSignature, match="is not signed"):
        verify_reference(reference, [key().public_key()])
    assert manifest_gets(referrers_registry) == 0


def test_a_referrer_for_another_digest_is_refused(
    signing_registry: Registry, referrers_registry: RegistryProxy
) -> None:
    private = key()
    digest = a_model(signing_registry, tag="v1", content=b"one")
    other = a_model(signing_registry, tag="v2", content=b"two")
    reference = parse_reference(f"{referrers_registry.host}/team/m:v2")
    sign_reference(reference, private)  # a referrer of v2's manifest
    [listed] = referrers(referrers_registry, other)
    serve_index(referrers_registry, digest, [listed])  # offered as v1's
    with pytest.raises(InvalidSignature, match=f"subject is {other}, not {digest}"):
        verify_reference(parse_reference(f"{referrers_registry.host}/team/m:v1"), [private.public_key()])


def test_a_referrer_that_does_not_match_its_digest_is_refused(
    signing_registry: Registry, referrers_registry: RegistryProxy
) -> None:
    private = key()
    digest = a_model(signing_registry)
    reference = parse_reference(f"{referrers_registry.host}/team/m:v1")
    layer = signature_layer(signing_registry, private, make_payload(str(reference), digest))
    body = json.dumps({"schemaVersion": 2, "layers": [layer], "subject": {"digest": digest}}).encode()
    claimed = "sha256:" + "0" * 64
    referrers_registry.controls.manifests[f"/v2/team/m/manifests/{claimed}"] = (body, OCI)
    serve_index(referrers_registry, digest, [signature_entry(claimed)])
    with pytest.raises(InvalidSignature, match="does not match its digest"):
        verify_reference(reference, [private.public_key()])
