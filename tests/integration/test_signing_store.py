"""#24, the store's side: `model verify --local/--deep` checks a pulled model offline against the signature
its verified pull kept; `inspect`, `ls --json`/`ls --verified` show the verification. The registry is
Debian's docker-registry (tests/registry.py), stopped before the store is verified."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from modelrunner.signing.payload import make_payload
from modelrunner.signing.record import read_record
from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, snapshot
from tests.models import write_tiny_gguf
from tests.registry import Registry
from tests.signing_fixtures import keygen, pushed

pytestmark = pytest.mark.usefixtures("cosign_password")


def pulled_under_policy(daemon: Daemon, registry: Registry, tmp_path: Path) -> tuple[str, Path]:
    """A model signed in the registry, removed, pulled again under a warn rule: the store keeps the
    signature it verified. Its reference and the public key."""
    private, public = keygen(daemon, tmp_path / "cosign")
    ref = pushed(daemon, registry, tmp_path, "team/tiny:v1", seed=11)
    daemon.cli("sign", "--key", str(private), ref)
    daemon.cli("rm", ref)
    daemon.cli("trust", "set", f"{registry.host}/team/*", "--key", str(public), "--mode", "warn")
    daemon.cli("pull", ref)
    return ref, public


def test_verify_local_checks_the_kept_signature_with_no_registry(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref, public = pulled_under_policy(daemon, signing_registry, tmp_path)
    signing_registry.stop()  # offline from here on
    before = snapshot(daemon.store_root)
    local = daemon.cli("verify", "--local", ref, "--key", str(public))
    model_id = daemon.models()[0]["id"]
    assert f"Verified {ref}@{model_id} in the store (signature)" in local.stdout
    assert "Signed by sha256:" in local.stdout and f"for {ref}" in local.stdout
    deep = daemon.cli("verify", "--deep", ref, "--key", str(public))
    assert "(signature and blob hashes)" in deep.stdout
    by_id = daemon.cli("verify", "--local", model_id.removeprefix("sha256:")[:12], "--key", str(public))
    assert by_id.returncode == 0
    assert snapshot(daemon.store_root) == before  # verifying changes nothing


def test_verify_local_fails_with_the_reason(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref, _ = pulled_under_policy(daemon, signing_registry, tmp_path)
    _, other = keygen(daemon, tmp_path / "other")
    wrong = daemon.cli("verify", "--local", ref, "--key", str(other), check=False)
    assert wrong.returncode == 1
    assert "Verification failed:" in wrong.stderr and "no signature was made by the given key" in wrong.stderr
    unsigned = f"{signing_registry.host}/team/local:v1"
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "local.gguf", seed=12)), unsigned)
    none_kept = daemon.cli("verify", "--local", unsigned, "--key", str(other), check=False)
    assert none_kept.returncode == 1 and "no signature kept in the store" in none_kept.stderr
    missing = daemon.cli("verify", "--local", "team/absent", "--key", str(other), check=False)
    assert missing.returncode == 1 and "Verification failed:" in missing.stderr
    bad_key = tmp_path / "bad.pub"
    bad_key.write_text("not a key")
    refused = daemon.cli("verify", "--local", ref, "--key", str(bad_key), check=False)
    assert refused.returncode == 1 and "public key" in refused.stderr


def test_a_changed_blob_fails_local_and_deep(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref, public = pulled_under_policy(daemon, signing_registry, tmp_path)
    store = ModelStore(daemon.store_root)
    stored = store.get(daemon.models()[0]["id"])
    layer = store.layout.blob_path(stored.manifest.layers[0].digest)
    data = layer.read_bytes()
    layer.unlink()  # replaced in the store: another file, one byte changed
    layer.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    local = daemon.cli("verify", "--local", ref, "--key", str(public), check=False)
    assert local.returncode == 1 and "changed in the store since it was verified" in local.stderr
    deep = daemon.cli("verify", "--deep", ref, "--key", str(public), check=False)
    assert deep.returncode == 1 and "does not hash to its digest" in deep.stderr


def test_inspect_and_ls_show_the_verification(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref, _ = pulled_under_policy(daemon, signing_registry, tmp_path)
    model_id = daemon.models()[0]["id"]
    record = read_record(ModelStore(daemon.store_root), model_id)
    assert record is not None and record.payload and record.signature
    inspected = json.loads(daemon.cli("inspect", ref).stdout)
    assert inspected["verification"]["signer"] == record.signer
    assert inspected["verification"]["dockerReference"] == ref
    assert inspected["verification"]["verifiedAt"].endswith("Z")
    listed = json.loads(daemon.cli("ls", "--json").stdout)
    assert listed[0]["verification"]["signer"] == record.signer
    table = daemon.cli("ls", "--verified").stdout.splitlines()
    assert table[0].split()[-1] == "VERIFIED" and record.signer[:19] in table[1]
    unsigned = f"{signing_registry.host}/team/local:v1"
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "local.gguf", seed=12)), unsigned)
    assert "verification" not in json.loads(daemon.cli("inspect", unsigned).stdout)


def test_a_tampered_record_or_a_bad_request_verifies_nothing(
    daemon: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref, public = pulled_under_policy(daemon, signing_registry, tmp_path)
    model_id = daemon.models()[0]["id"]
    bad_bodies: list[dict[str, object]] = [{"keys": []}, {"keys": ["x"], "extra": 1}, {"keys": "not a list"}]
    for body in bad_bodies:
        refused = daemon.http("POST", f"/models/{ref}/verify", json=body)
        assert refused.status_code == 400, refused.text
    path = daemon.store_root / "signatures" / (model_id.removeprefix("sha256:") + ".json")
    record = json.loads(path.read_text())
    other = make_payload(ref, "sha256:" + "1" * 64)  # the payload swapped, the signature kept
    path.write_text(json.dumps({**record, "payload": base64.b64encode(other).decode()}))
    swapped = daemon.cli("verify", "--local", ref, "--key", str(public), check=False)
    assert swapped.returncode == 1 and "no signature was made by the given key" in swapped.stderr
