"""#24, keyless signatures: a Sigstore bundle (Fulcio certificate, Rekor entry) stored as an OCI referrer of
the model's manifest, as cosign v3 stores it, verified offline against a trusted root the test supplies.
The Sigstore is the test's own (tests/fake_sigstore.py); the referrers API is tests/referrers.py's proxy in
front of Debian's docker-registry."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.reference import parse_reference
from modelrunner.signing.keyless import (
    BUNDLE_MEDIA_TYPE,
    Identity,
    load_trusted_root,
    verify_reference_keyless,
)
from modelrunner.signing.payload import InvalidSignature
from modelrunner.signing.policy import load_rules, policy_path
from modelrunner.signing.record import problem_before_load
from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, free_port, snapshot
from tests.fake_sigstore import FakeSigstore, statement
from tests.models import write_tiny_gguf
from tests.registry import Registry, RegistryProxy
from tests.signing_fixtures import OCI, a_model, upload

ME = Identity("dev@example.com", "https://issuer.example")


@pytest.fixture
def sigstore() -> FakeSigstore:
    return FakeSigstore()


def store_bundle(
    registry: Registry, proxy: RegistryProxy, digest: str, bundle: dict[str, Any] | bytes
) -> None:
    """The bundle as cosign v3 stores it: a referrer manifest of `digest` whose one layer is the bundle."""
    data = bundle if isinstance(bundle, bytes) else json.dumps(bundle).encode()
    layer = {**upload(registry, "team/m", data), "mediaType": BUNDLE_MEDIA_TYPE}
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI,
        "artifactType": BUNDLE_MEDIA_TYPE,
        "config": {**upload(registry, "team/m", b"{}"), "mediaType": "application/vnd.oci.empty.v1+json"},
        "layers": [layer],
        "subject": {"mediaType": OCI, "digest": digest, "size": 1},
    }
    httpx.put(
        f"http://{proxy.host}/v2/team/m/manifests/sha256-bundle-{len(data)}",
        content=json.dumps(manifest).encode(),
        headers={"Content-Type": OCI},
    ).raise_for_status()


def signed_model(
    registry: Registry, proxy: RegistryProxy, sigstore: FakeSigstore, identity: Identity = ME
) -> str:
    digest = a_model(registry)
    payload = statement(f"{proxy.host}/team/m", digest)
    store_bundle(registry, proxy, digest, sigstore.bundle(payload, identity.identity, identity.issuer))
    return digest


def verify(proxy: RegistryProxy, sigstore: FakeSigstore, identity: Identity = ME) -> str:
    root = load_trusted_root(json.dumps(sigstore.trusted_root()))
    return verify_reference_keyless(parse_reference(f"{proxy.host}/team/m:v1"), [identity], root).signer


def pulled_keyless(
    daemon: Daemon, registry: Registry, proxy: RegistryProxy, sigstore: FakeSigstore, tmp_path: Path
) -> str:
    """A model signed keyless by ME, pulled under an enforce rule trusting ME: its ID."""
    ref = f"{proxy.host}/team/m:v1"
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "t.gguf", seed=31)), "--push", ref)
    digest = str(daemon.models()[0]["id"])
    bundle = sigstore.bundle(statement(f"{proxy.host}/team/m", digest), ME.identity, ME.issuer)
    store_bundle(registry, proxy, digest, bundle)
    daemon.cli("rm", ref)
    root = tmp_path / "trusted_root.json"
    root.write_text(json.dumps(sigstore.trusted_root()))
    identity = ["--certificate-identity", ME.identity, "--certificate-oidc-issuer", ME.issuer]
    daemon.cli("trust", "set", f"{proxy.host}/team/*", *identity, "--trusted-root", str(root))
    daemon.cli("pull", ref)
    return digest


def test_model_verify_checks_a_keyless_bundle_against_the_trusted_root(
    signing_registry: Registry, referrers_registry: RegistryProxy, sigstore: FakeSigstore, tmp_path: Path
) -> None:
    digest = signed_model(signing_registry, referrers_registry, sigstore)
    root = tmp_path / "trusted_root.json"
    root.write_text(json.dumps(sigstore.trusted_root()))
    cli = Daemon(tmp_path / "home", free_port())  # the verification runs in the CLI: no daemon needed
    ref = f"{referrers_registry.host}/team/m:v1"
    flags = ["--certificate-oidc-issuer", ME.issuer, "--trusted-root", str(root)]
    verified = cli.cli("verify", ref, "--certificate-identity", ME.identity, *flags)
    assert f"Verified {ref}@{digest}" in verified.stdout
    assert f"Signed by {ME.identity} ({ME.issuer}) for {referrers_registry.host}/team/m" in verified.stdout
    other = cli.cli("verify", ref, "--certificate-identity", "eve@example.com", *flags, check=False)
    assert other.returncode == 1
    assert "Verification failed" in other.stderr and "do not match eve@example.com" in other.stderr


def test_another_issuer_for_the_same_identity_is_refused(
    signing_registry: Registry, referrers_registry: RegistryProxy, sigstore: FakeSigstore
) -> None:
    signed_model(signing_registry, referrers_registry, sigstore)
    with pytest.raises(InvalidSignature, match=r"https://issuer\.example"):
        verify(referrers_registry, sigstore, Identity(ME.identity, "https://other-issuer.example"))
    assert verify(referrers_registry, sigstore).startswith(ME.identity)


def test_a_bundle_from_another_sigstore_is_refused(
    signing_registry: Registry, referrers_registry: RegistryProxy, sigstore: FakeSigstore
) -> None:
    """Its certificate does not chain to the trusted root's CA, whatever identity it names."""
    signed_model(signing_registry, referrers_registry, FakeSigstore())
    with pytest.raises(InvalidSignature, match="certificate chain"):
        verify(referrers_registry, sigstore)


def test_a_log_entry_the_trusted_rekor_did_not_sign_is_refused(
    signing_registry: Registry, referrers_registry: RegistryProxy, sigstore: FakeSigstore
) -> None:
    """The CA and CT log are trusted, the Rekor log is another: its checkpoint does not verify."""
    impostor = FakeSigstore()
    impostor.ca_key, impostor.ca_cert, impostor.ct_key = sigstore.ca_key, sigstore.ca_cert, sigstore.ct_key
    signed_model(signing_registry, referrers_registry, impostor)
    with pytest.raises(InvalidSignature, match="invalid log entry"):
        verify(referrers_registry, sigstore)


def test_a_bundle_for_another_manifest_is_refused(
    signing_registry: Registry, referrers_registry: RegistryProxy, sigstore: FakeSigstore
) -> None:
    """A valid bundle moved onto this manifest: its statement names another digest."""
    digest = a_model(signing_registry)
    other = "sha256:" + "0" * 64
    bundle = sigstore.bundle(statement(f"{referrers_registry.host}/team/m", other), ME.identity, ME.issuer)
    store_bundle(signing_registry, referrers_registry, digest, bundle)
    with pytest.raises(InvalidSignature, match=f"for another manifest, not {digest}"):
        verify(referrers_registry, sigstore)


def test_a_tampered_envelope_is_refused(
    signing_registry: Registry, referrers_registry: RegistryProxy, sigstore: FakeSigstore
) -> None:
    digest = a_model(signing_registry)
    bundle = sigstore.bundle(statement(f"{referrers_registry.host}/team/m", digest), ME.identity, ME.issuer)
    bundle["dsseEnvelope"]["payload"] = bundle["dsseEnvelope"]["payload"][:-8] + "AAAAAAA="
    store_bundle(signing_registry, referrers_registry, digest, bundle)
    with pytest.raises(InvalidSignature, match="team/m@sha256:"):
        verify(referrers_registry, sigstore)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"not json", "failed to load bundle"),
        (b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}', "failed to load bundle"),
        (b"{" * 300 * 1024, "a Sigstore bundle is too large"),
    ],
    ids=["not-json", "empty", "oversized"],
)
def test_hostile_bundles_are_refused_with_the_reason(
    signing_registry: Registry,
    referrers_registry: RegistryProxy,
    sigstore: FakeSigstore,
    content: bytes,
    reason: str,
) -> None:
    store_bundle(signing_registry, referrers_registry, a_model(signing_registry), content)
    with pytest.raises(InvalidSignature, match=reason):
        verify(referrers_registry, sigstore)


def test_no_bundle_and_no_referrers_api(
    signing_registry: Registry, referrers_registry: RegistryProxy, sigstore: FakeSigstore
) -> None:
    a_model(signing_registry)
    with pytest.raises(InvalidSignature, match="has no Sigstore bundle"):
        verify(referrers_registry, sigstore)
    referrers_registry.controls.serve_referrers = False
    with pytest.raises(InvalidSignature, match="has no Sigstore bundle"):
        verify(referrers_registry, sigstore)


def test_a_trusted_root_that_does_not_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSignature, match="the trusted root does not hold"):
        load_trusted_root('{"mediaType": "something else"}')
    with pytest.raises(InvalidSignature, match="the trusted root does not hold"):
        load_trusted_root("[")
    cli = Daemon(tmp_path / "home", free_port())
    flags = ["--certificate-identity", ME.identity, "--certificate-oidc-issuer", ME.issuer]
    result = cli.cli(
        "verify", "localhost:1/a/b:v1", *flags, "--trusted-root", str(tmp_path / "none"), check=False
    )
    assert result.returncode == 1
    assert "cannot read the trusted root" in result.stderr


def test_a_policy_of_an_identity_pulls_what_it_signed_and_refuses_the_rest(
    daemon: Daemon,
    signing_registry: Registry,
    referrers_registry: RegistryProxy,
    sigstore: FakeSigstore,
    tmp_path: Path,
) -> None:
    """`model trust set --certificate-identity`: the daemon's pull verifies the bundle before any blob is
    stored, keeps the verification for the check before a load, and refuses another signer's model."""
    ref = f"{referrers_registry.host}/team/m:v1"
    pulled_keyless(daemon, signing_registry, referrers_registry, sigstore, tmp_path)
    assert f"{ME.identity} ({ME.issuer})" in daemon.cli("trust", "ls").stdout
    root = tmp_path / "trusted_root.json"
    pattern = f"{referrers_registry.host}/team/*"
    [model] = daemon.models()
    assert model["verification"]["signer"] == f"{ME.identity} ({ME.issuer})"
    store = ModelStore(daemon.store_root)
    [rule] = load_rules(policy_path(daemon.home))
    assert problem_before_load(store, store.get(model["id"]), rule) is None  # a load would run it
    daemon.cli("rm", ref)
    before = snapshot(daemon.store_root)
    other = ["--certificate-identity", "eve@example.com", "--certificate-oidc-issuer", ME.issuer]
    daemon.cli("trust", "set", pattern, *other, "--trusted-root", str(root))
    refused = daemon.cli("pull", ref, check=False)
    assert refused.returncode == 1
    assert "signature check failed" in refused.stderr and "eve@example.com" in refused.stderr
    assert snapshot(daemon.store_root) == before


def test_trust_set_refuses_a_trusted_root_that_does_not_hold(daemon: Daemon, tmp_path: Path) -> None:
    root = tmp_path / "trusted_root.json"
    root.write_text('{"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1", "tlogs": 1}')
    identity = ["--certificate-identity", ME.identity, "--certificate-oidc-issuer", ME.issuer]
    refused = daemon.cli("trust", "set", "*", *identity, "--trusted-root", str(root), check=False)
    assert refused.returncode != 0 and "the trusted root does not hold" in refused.stderr
    alone = daemon.cli("trust", "set", "*", "--certificate-identity", ME.identity, check=False)
    assert alone.returncode != 0 and "go together" in alone.stderr
    assert not (daemon.home / "trust-policy.json").exists()


def test_a_keyless_record_is_bound_to_its_model(
    daemon: Daemon,
    signing_registry: Registry,
    referrers_registry: RegistryProxy,
    sigstore: FakeSigstore,
    tmp_path: Path,
) -> None:
    """Issue 36 item 2: a keyless verification record keeps the Sigstore bundle, checked again offline
    against the rule in force before a load. Copied to an unsigned model, its digest and blob files changed
    to that model's, it lets nothing load (before, the signer's name alone was compared); a record that
    keeps no bundle (the earlier form) is verified again by a pull; a signer no longer trusted is refused."""
    signed_id = pulled_keyless(daemon, signing_registry, referrers_registry, sigstore, tmp_path)
    unsigned = f"{referrers_registry.host}/team/local:v1"
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "local.gguf", seed=32)), unsigned)
    store = ModelStore(daemon.store_root)
    [rule] = load_rules(policy_path(daemon.home))
    signed = store.get(signed_id)
    forged = store.get(unsigned, by_name=True)
    assert problem_before_load(store, signed, rule) is None
    assert problem_before_load(store, forged, rule) is not None  # no record

    records = daemon.store_root / "signatures"
    record = json.loads((records / (signed_id.removeprefix("sha256:") + ".json")).read_text())
    blobs = {}
    for blob in forged.manifest.blobs:
        info = os.stat(store.layout.blob_path(blob.digest))
        blobs[blob.digest] = [info.st_size, info.st_ino, info.st_mtime_ns, info.st_ctime_ns]
    forged_record = records / (forged.id.removeprefix("sha256:") + ".json")
    forged_record.write_text(json.dumps({**record, "digest": forged.id, "blobs": blobs}))
    problem = problem_before_load(store, forged, rule)
    assert problem is not None and "Sigstore bundle does not hold" in problem, problem
    assert f"another manifest, not {forged.id}" in problem

    older = records / (signed_id.removeprefix("sha256:") + ".json")
    older.write_text(json.dumps({**record, "bundle": ""}))  # a record of before the bundle was kept
    problem = problem_before_load(store, signed, rule)
    assert problem is not None and "keeps no Sigstore bundle" in problem and "pull it again" in problem
    daemon.cli("pull", f"{referrers_registry.host}/team/m:v1")  # verified anew: the record keeps the bundle
    assert problem_before_load(store, signed, rule) is None

    eve = ["--certificate-identity", "eve@example.com", "--certificate-oidc-issuer", ME.issuer]
    root = str(tmp_path / "trusted_root.json")
    daemon.cli("trust", "set", f"{referrers_registry.host}/team/*", *eve, "--trusted-root", root)
    [rotated] = load_rules(policy_path(daemon.home))
    problem = problem_before_load(store, signed, rotated)
    assert problem is not None and ME.identity in problem and "no longer trusts" in problem
