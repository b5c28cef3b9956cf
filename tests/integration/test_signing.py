"""Signed models against Debian's docker-registry (cosign's `.sig` tag): `model trust keygen`, `model sign`,
`model push --sign-key`, `model verify`, and both directions with openssl over cosign's layout."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from modelrunner.signing.record import problem_before_load, read_record
from modelrunner.signing.registry import signature_tag
from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, error_message, free_port
from tests.models import write_tiny_gguf
from tests.registry import Registry, require_tool
from tests.signing_fixtures import OCI, keygen, pushed, upload

pytestmark = pytest.mark.usefixtures("cosign_password")


def manifest_digest(registry: Registry, repository: str, reference: str) -> str:
    response = httpx.head(
        f"{registry.url}/v2/{repository}/manifests/{reference}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    response.raise_for_status()
    return str(response.headers["docker-content-digest"])


def test_sign_then_verify(daemon: Daemon, signing_registry: Registry, tmp_path: Path) -> None:
    private, public = keygen(daemon, tmp_path / "cosign")
    ref = pushed(daemon, signing_registry, tmp_path)
    daemon.cli("sign", "--key", str(private), ref)
    digest = manifest_digest(signing_registry, "team/tiny", "v1")
    assert manifest_digest(signing_registry, "team/tiny", signature_tag(digest))  # cosign's place for it
    verified = daemon.cli("verify", ref, "--key", str(public))
    assert f"Verified {ref}@{digest}" in verified.stdout


def test_push_with_a_sign_key_signs_what_it_pushed(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    private, public = keygen(daemon, tmp_path / "cosign")
    ref = f"{signing_registry.host}/team/tiny:v2"
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "t.gguf")), ref)
    daemon.cli("push", "--sign-key", str(private), ref)
    assert daemon.cli("verify", ref, "--key", str(public)).returncode == 0


def test_verify_fails_with_the_reason(daemon: Daemon, signing_registry: Registry, tmp_path: Path) -> None:
    private, _ = keygen(daemon, tmp_path / "signer")
    _, other_public = keygen(daemon, tmp_path / "other")
    ref = pushed(daemon, signing_registry, tmp_path)
    unsigned = daemon.cli("verify", ref, "--key", str(other_public), check=False)
    assert unsigned.returncode == 1
    assert "Verification failed:" in unsigned.stderr and "is not signed" in unsigned.stderr
    daemon.cli("sign", "--key", str(private), ref)
    wrong_key = daemon.cli("verify", ref, "--key", str(other_public), check=False)
    assert wrong_key.returncode == 1 and "no signature was made by the given key" in wrong_key.stderr


def test_a_wrong_password_signs_nothing(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private, _ = keygen(daemon, tmp_path / "cosign")
    ref = pushed(daemon, signing_registry, tmp_path)
    monkeypatch.setenv("COSIGN_PASSWORD", "wrong")
    result = daemon.cli("sign", "--key", str(private), ref, check=False)
    assert result.returncode == 1 and "wrong password" in result.stderr
    digest = manifest_digest(signing_registry, "team/tiny", "v1")
    response = httpx.head(f"{signing_registry.url}/v2/team/tiny/manifests/{signature_tag(digest)}")
    assert response.status_code == 404


def test_a_signature_moved_to_another_model_does_not_verify(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    """A registry in the middle copies model A's signature manifest to model B's `.sig` tag."""
    private, public = keygen(daemon, tmp_path / "cosign")
    signed = pushed(daemon, signing_registry, tmp_path, "team/tiny:a", seed=0)
    other = pushed(daemon, signing_registry, tmp_path, "team/tiny:b", seed=1)
    daemon.cli("sign", "--key", str(private), signed)
    digest_a = manifest_digest(signing_registry, "team/tiny", "a")
    digest_b = manifest_digest(signing_registry, "team/tiny", "b")
    sig_manifest = httpx.get(
        f"{signing_registry.url}/v2/team/tiny/manifests/{signature_tag(digest_a)}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    ).content
    httpx.put(
        f"{signing_registry.url}/v2/team/tiny/manifests/{signature_tag(digest_b)}",
        content=sig_manifest,
        headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
    ).raise_for_status()
    result = daemon.cli("verify", other, "--key", str(public), check=False)
    assert result.returncode == 1 and "signature is for another manifest" in result.stderr


# --- an independent implementation of the crypto: openssl, over cosign's layout followed by hand --------
# Debian's skopeo (1.9.3+ds1) is built without sigstore ("Debian-local change: sigstore disabled", both for
# `--sign-by-sigstore-private-key` and for a `sigstoreSigned` policy), and Debian has no cosign: the
# other side here is openssl, reading and writing the `.sig` manifest as cosign's specification lays it out.


def openssl(*args: str) -> subprocess.CompletedProcess[str]:
    require_tool("openssl", "openssl")
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result


def test_openssl_verifies_what_model_sign_stored(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    private, public = keygen(daemon, tmp_path / "cosign")
    ref = pushed(daemon, signing_registry, tmp_path)
    daemon.cli("sign", "--key", str(private), ref)
    digest = manifest_digest(signing_registry, "team/tiny", "v1")
    sig_manifest = httpx.get(
        f"{signing_registry.url}/v2/team/tiny/manifests/{signature_tag(digest)}", headers={"Accept": OCI}
    ).json()
    (layer,) = sig_manifest["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = httpx.get(f"{signing_registry.url}/v2/team/tiny/blobs/{layer['digest']}").content
    claim = json.loads(payload)["critical"]
    assert claim["image"]["docker-manifest-digest"] == digest
    assert claim["identity"]["docker-reference"] == ref
    (tmp_path / "payload").write_bytes(payload)
    signature = base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"])
    (tmp_path / "signature").write_bytes(signature)
    checked = openssl(
        "dgst",
        "-sha256",
        "-verify",
        str(public),
        "-signature",
        str(tmp_path / "signature"),
        str(tmp_path / "payload"),
    )
    assert "Verified OK" in checked.stdout


def test_model_verify_takes_a_signature_made_elsewhere(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    """openssl's key and signature, a payload laid out differently (indented, keys in another order)."""
    ref = pushed(daemon, signing_registry, tmp_path)
    digest = manifest_digest(signing_registry, "team/tiny", "v1")
    key, public = tmp_path / "ec.pem", tmp_path / "ec.pub"
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
    openssl("ec", "-in", str(key), "-pubout", "-out", str(public))
    claim = {
        "optional": {"creator": "openssl"},
        "critical": {
            "type": "cosign container image signature",
            "image": {"docker-manifest-digest": digest},
            "identity": {"docker-reference": f"{signing_registry.host}/team/tiny"},
        },
    }
    payload = json.dumps(claim, indent=2).encode()
    (tmp_path / "payload").write_bytes(payload)
    openssl("dgst", "-sha256", "-sign", str(key), "-out", str(tmp_path / "sig"), str(tmp_path / "payload"))
    payload_digest = upload(signing_registry, "team/tiny", payload)["digest"]
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [payload_digest]}}).encode()
    config_digest = upload(signing_registry, "team/tiny", config)["digest"]
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "size": len(config),
            "digest": config_digest,
        },
        "layers": [
            {
                "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                "size": len(payload),
                "digest": payload_digest,
                "annotations": {
                    "dev.cosignproject.cosign/signature": base64.b64encode(
                        (tmp_path / "sig").read_bytes()
                    ).decode()
                },
            }
        ],
    }
    httpx.put(
        f"{signing_registry.url}/v2/team/tiny/manifests/{signature_tag(digest)}",
        content=json.dumps(manifest).encode(),
        headers={"Content-Type": OCI},
    ).raise_for_status()
    verified = daemon.cli("verify", ref, "--key", str(public))
    assert f"Verified {ref}@{digest}" in verified.stdout


# --- the trust policy on pull ----------------------------------------------------------------------------


def blobs(daemon: Daemon) -> set[str]:
    return {p.name for p in daemon.store_root.rglob("*") if p.is_file() and "blobs" in p.parts}


def test_enforce_refuses_an_unsigned_pull_before_any_blob_is_stored(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    private, public = keygen(daemon, tmp_path / "cosign")
    ref = pushed(daemon, signing_registry, tmp_path, "team/tiny:v1", seed=3)
    daemon.cli("rm", ref)
    before = blobs(daemon)
    daemon.cli("trust", "set", f"{signing_registry.host}/team/*", "--key", str(public), "--mode", "enforce")
    assert f"{signing_registry.host}/team/*" in daemon.cli("trust", "ls").stdout
    refused = daemon.cli("pull", ref, check=False)
    assert refused.returncode == 1
    assert "Failed to pull model" in refused.stderr and "is not signed" in refused.stderr
    assert blobs(daemon) == before
    daemon.cli("sign", "--key", str(private), ref)
    daemon.cli("pull", ref)
    assert any(ref in model["tags"] for model in daemon.models())


def test_warn_pulls_an_unsigned_model_and_says_so(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    _, public = keygen(daemon, tmp_path / "cosign")
    ref = pushed(daemon, signing_registry, tmp_path, "team/tiny:v1", seed=4)
    daemon.cli("rm", ref)
    daemon.cli("trust", "set", "*", "--key", str(public), "--mode", "warn")
    pulled = daemon.cli("pull", ref)
    assert "Warning:" in pulled.stderr and "is not signed" in pulled.stderr
    logs = [daemon.log, *sorted((daemon.home / "logs").glob("*.log"))]
    assert any("pulling anyway (trust policy mode warn)" in path.read_text() for path in logs)
    assert any(ref in model["tags"] for model in daemon.models())
    daemon.cli("trust", "rm", "*")
    assert "*" not in daemon.cli("trust", "ls", "--json").stdout


def test_a_policy_that_is_not_valid_refuses_the_pull(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref = pushed(daemon, signing_registry, tmp_path, "team/tiny:v1", seed=5)
    daemon.cli("rm", ref)
    before = blobs(daemon)
    (daemon.home / "trust-policy.json").write_text("{not json")
    refused = daemon.cli("pull", ref, check=False)
    assert refused.returncode == 1 and "trust policy" in refused.stderr and "not JSON" in refused.stderr
    assert blobs(daemon) == before
    bad_key = tmp_path / "bad.pub"
    bad_key.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    (daemon.home / "trust-policy.json").unlink()
    result = daemon.cli("trust", "set", "*", "--key", str(bad_key), check=False)
    assert result.returncode == 1 and "public key" in result.stderr
    assert not (daemon.home / "trust-policy.json").exists()


# --- before every load ------------------------------------------------------------------------------------


def chat(daemon: Daemon, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return daemon.http("POST", "/engines/v1/chat/completions", json=body)


@pytest.fixture
def engine_daemon(tmp_path: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    running = Daemon(tmp_path / "home", free_port()).start()
    yield running
    running.stop()


def test_enforce_runs_only_what_was_verified(
    engine_daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    daemon = engine_daemon
    private, public = keygen(daemon, tmp_path / "cosign")
    ref = pushed(daemon, signing_registry, tmp_path, "team/tiny:v1", seed=6)
    daemon.cli("sign", "--key", str(private), ref)
    daemon.cli("rm", ref)
    daemon.cli("trust", "set", f"{signing_registry.host}/team/*", "--key", str(public))
    local = f"{signing_registry.host}/team/local:v1"  # packaged here, never signed
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "local.gguf", seed=7)), local)
    refused = chat(daemon, local)  # refused before any engine starts
    assert refused.status_code == 403
    assert "no verified signature" in error_message(refused)
    daemon.cli("pull", ref)
    model = next(m for m in daemon.models() if ref in m["tags"])
    store = ModelStore(daemon.store_root)
    record = read_record(store, model["id"])
    assert record is not None and record.digest == model["id"]
    stored = store.get(model["id"])
    assert problem_before_load(store, stored) is None
    assert chat(daemon, ref).status_code == 200  # what was verified runs
    daemon.cli("unload", "--all")
    layer = store.layout.blob_path(stored.manifest.layers[0].digest)
    data = layer.read_bytes()
    layer.unlink()  # replaced in the store: same bytes, another file
    layer.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    changed = chat(daemon, ref)
    assert changed.status_code == 403 and "changed in the store" in error_message(changed)
    logs = [daemon.log, *sorted((daemon.home / "logs").glob("*.log"))]
    assert any("load refused" in path.read_text() for path in logs)
