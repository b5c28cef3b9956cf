"""#36: a load is checked against the trust policy in force then, not the one of the pull. A key the policy
no longer trusts, a verification record copied from another model, a blob written in place with its mtime
set back, and a policy file that another user could write are each refused under `enforce`. The registry is
Debian's docker-registry; the daemon runs in this process with the scripted engine (tests/fake_engine.py),
and the CLI (its own process) talks to it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, error_message
from tests.fake_engine import FakeEngine
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf
from tests.registry import Registry
from tests.signing_fixtures import keygen, pushed
from tests.users import OTHER_UID

pytestmark = pytest.mark.usefixtures("cosign_password")


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signing_registry: Registry) -> Iterator[Daemon]:
    """The daemon (scripted engine) in this process; what is returned runs the CLI against it."""
    home = tmp_path / "home"
    monkeypatch.setenv("MODEL_RUNNER_HOME", str(home))
    served = InProcessDaemon(home, {"llama.cpp": FakeEngine()}).start()
    yield Daemon(home, served.port)
    served.stop()


def chat(daemon: Daemon, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return daemon.http("POST", "/engines/v1/chat/completions", json=body)


def pulled_under_enforce(daemon: Daemon, registry: Registry, tmp_path: Path) -> tuple[str, Path]:
    """A model signed by key `a` in the registry, pulled under an enforce rule trusting `a`: its reference
    and the key's private file."""
    private, public = keygen(daemon, tmp_path / "a")
    ref = pushed(daemon, registry, tmp_path, "team/tiny:v1", seed=21)
    daemon.cli("sign", "--key", str(private), ref)
    daemon.cli("rm", ref)
    daemon.cli("trust", "set", f"{registry.host}/team/*", "--key", str(public))
    daemon.cli("pull", ref)
    return ref, public


def record_file(daemon: Daemon, model_id: str) -> Path:
    return daemon.store_root / "signatures" / (model_id.removeprefix("sha256:") + ".json")


def model_id(daemon: Daemon, ref: str) -> str:
    return str(next(m["id"] for m in daemon.models() if ref in m["tags"]))


def layer_path(daemon: Daemon, ref: str) -> Path:
    store = ModelStore(daemon.store_root)
    stored = store.get(model_id(daemon, ref))
    return store.layout.blob_path(stored.manifest.layers[0].digest)


def test_a_key_no_longer_trusted_is_refused_at_load_and_shown_by_ls(
    runner: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref, _ = pulled_under_enforce(runner, signing_registry, tmp_path)
    signer = json.loads(runner.cli("inspect", ref).stdout)["verification"]["signer"]
    assert chat(runner, ref).status_code == 200
    verified = runner.cli("ls", "--verified").stdout
    assert signer[:19] in verified and "no longer trusted" not in verified
    runner.cli("unload", "--all")

    signing_b, rotated = keygen(runner, tmp_path / "b")  # the policy now trusts key b only
    runner.cli("trust", "set", f"{signing_registry.host}/team/*", "--key", str(rotated))
    refused = chat(runner, ref)
    assert refused.status_code == 403
    message = error_message(refused)
    assert f"signed by key {signer[:19]}" in message and "no longer trusts" in message
    assert "sign it again with a trusted key" in message and "verify it anew" in message
    row = next(line for line in runner.cli("ls", "--verified").stdout.splitlines() if "tiny" in line)
    assert row.rstrip().endswith(f"{signer[:19]} (no longer trusted)")
    inspected = json.loads(runner.cli("inspect", ref).stdout)
    assert "no longer trusts" in inspected["verification"]["notTrusted"]

    runner.cli("sign", "--key", str(signing_b), ref)  # signed again with key b, pulled again: it runs
    runner.cli("pull", ref)
    assert chat(runner, ref).status_code == 200
    assert "no longer trusted" not in runner.cli("ls", "--verified").stdout


def test_a_record_copied_from_another_model_lets_nothing_load(
    runner: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref, _ = pulled_under_enforce(runner, signing_registry, tmp_path)
    unsigned = f"{signing_registry.host}/team/local:v1"
    runner.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "local.gguf", seed=22)), unsigned)
    assert chat(runner, unsigned).status_code == 403  # no record: refused
    # Someone who can write the store copies the signed model's record to the unsigned one, its digest
    # and blob files changed to the unsigned model's (as many fields as the record keeps).
    signed_id, forged_id = model_id(runner, ref), model_id(runner, unsigned)
    record = json.loads(record_file(runner, signed_id).read_text())
    fields = len(next(iter(record["blobs"].values())))
    store = ModelStore(runner.store_root)
    blobs = {}
    for blob in store.get(forged_id).manifest.blobs:
        info = os.stat(store.layout.blob_path(blob.digest))
        blobs[blob.digest] = [info.st_size, info.st_ino, info.st_mtime_ns, info.st_ctime_ns][:fields]
    record_file(runner, forged_id).write_text(json.dumps({**record, "digest": forged_id, "blobs": blobs}))
    refused = chat(runner, unsigned)
    assert refused.status_code == 403
    assert "signature is for another manifest" in error_message(refused)
    assert chat(runner, ref).status_code == 200  # the signed one still runs


def test_bytes_written_in_place_with_the_mtime_set_back_are_refused(
    runner: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref, public = pulled_under_enforce(runner, signing_registry, tmp_path)
    assert chat(runner, ref).status_code == 200
    runner.cli("unload", "--all")
    assert chat(runner, ref).status_code == 200  # loaded again: its first load changed nothing recorded
    runner.cli("unload", "--all")
    layer = layer_path(runner, ref)
    before = os.stat(layer)
    with open(layer, "r+b") as handle:  # 512 bytes changed in place: same file, same size
        handle.seek(64)
        data = handle.read(512)
        handle.seek(64)
        handle.write(bytes(b ^ 0xFF for b in data))
    os.utime(layer, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(layer)
    assert (after.st_size, after.st_ino, after.st_mtime_ns) == (
        before.st_size,
        before.st_ino,
        before.st_mtime_ns,
    )
    refused = chat(runner, ref)
    assert refused.status_code == 403 and "changed in the store" in error_message(refused)
    deep = runner.cli("verify", "--deep", ref, "--key", str(public), check=False)
    assert deep.returncode == 1 and "does not hash to its digest" in deep.stderr
    assert chat(runner, ref).status_code == 403  # a failed deep check records nothing
    again = runner.cli("pull", ref, check=False)  # the model is in the store: its changed blob is hashed
    assert again.returncode == 1 and "does not hash to its digest" in again.stderr
    assert chat(runner, ref).status_code == 403  # a pull never records a changed file as verified


def test_a_moved_ctime_or_an_older_record_loads_again_after_verify_deep(
    runner: Daemon, signing_registry: Registry, tmp_path: Path
) -> None:
    ref, public = pulled_under_enforce(runner, signing_registry, tmp_path)
    layer = layer_path(runner, ref)
    link = tmp_path / "a-link"
    os.link(layer, link)  # a new hard link (as another model's bundle makes) moves the ctime, not the bytes
    link.unlink()
    refused = chat(runner, ref)
    assert refused.status_code == 403 and "model verify --deep" in error_message(refused)
    runner.cli(
        "verify", "--deep", ref, "--key", str(public)
    )  # hashed: the record takes the files as they are
    assert chat(runner, ref).status_code == 200
    runner.cli("unload", "--all")

    path = record_file(runner, model_id(runner, ref))
    record = json.loads(path.read_text())  # a record of before ctime was kept: size, inode, mtime
    path.write_text(json.dumps({**record, "blobs": {d: s[:3] for d, s in record["blobs"].items()}}))
    older = chat(runner, ref)
    assert older.status_code == 403 and "predates" in error_message(older)
    runner.cli("verify", "--deep", ref, "--key", str(public))
    assert chat(runner, ref).status_code == 200


@pytest.mark.parametrize("unsafe", ["file writable by others", "file of another user", "folder writable"])
def test_a_policy_another_user_could_write_is_refused_not_ignored(
    runner: Daemon, signing_registry: Registry, tmp_path: Path, unsafe: str
) -> None:
    ref, _ = pulled_under_enforce(runner, signing_registry, tmp_path)
    policy = runner.home / "trust-policy.json"
    if unsafe == "file writable by others":
        policy.chmod(0o666)
        expected = f"{policy} may be written by other users (mode 666)"
    elif unsafe == "file of another user":
        os.chown(policy, OTHER_UID, OTHER_UID)
        expected = f"{policy} belongs to uid {OTHER_UID}"
    else:
        runner.home.chmod(0o777)
        expected = f"{runner.home} may be written by other users (mode 777)"
    refused = chat(runner, ref)
    assert refused.status_code == 400
    message = error_message(refused)
    assert "refusing the trust policy" in message and expected in message
    listed = runner.cli("trust", "ls", check=False)
    assert listed.returncode == 1 and expected in listed.stderr
    pull = runner.cli("pull", ref, check=False)
    assert pull.returncode == 1 and expected in pull.stderr
    policy.chmod(0o644)  # made the daemon user's alone again: obeyed again
    os.chown(policy, os.geteuid(), os.getegid())
    runner.home.chmod(0o755)
    assert chat(runner, ref).status_code == 200
