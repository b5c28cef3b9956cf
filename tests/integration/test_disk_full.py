"""A model store on a real file system that fills up (a 4 MiB tmpfs mounted for the test): every write
route answers 507 "no space left on device" in its API's JSON shape, the CLI says so, and the store is
left intact and consistent; removing a model still works, so that the store can free space."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.artifact.builder import PackageSpec, build_artifact
from modelrunner.store.archive import export_chunks
from modelrunner.store.sink import StoreSink
from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, free_port
from tests.models import write_tiny_gguf

FILLER = ".filler"  # what fills the file system; not part of the store


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Path]:
    """<home>/models on a tmpfs of 4 MiB (mounting needs root: the suite runs as root in CI)."""
    if os.geteuid() != 0:
        pytest.fail("this test mounts a small tmpfs as the model store, which needs root", pytrace=False)
    models = tmp_path / "home" / "models"
    models.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "modelrunner-test", str(models)], check=True)
    try:
        yield models
    finally:
        if subprocess.run(["umount", str(models)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(models)], check=False)


@pytest.fixture
def daemon(small_store: Path) -> Iterator[Daemon]:
    running = Daemon(small_store.parent, free_port()).start()
    yield running
    running.stop()


def fill(folder: Path) -> None:
    with open(folder / FILLER, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    # the last partial page too
    with open(folder / FILLER, "ab", buffering=0) as handle:
        for _ in range(4096):
            try:
                handle.write(b"\0")
            except OSError:
                break


def contents(root: Path) -> dict[str, str]:
    """Every file of the store with its sha256 (the filler and lock files aside)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != FILLER and not p.name.endswith(".lock")
    }


def assert_consistent(root: Path, daemon: Daemon) -> None:
    """Every model the daemon lists has its manifest and every blob, each blob matching its digest."""
    store = ModelStore(root)
    for entry in daemon.models():
        model = store.get(entry["id"])
        for blob in [model.manifest.config, *model.manifest.layers]:
            data = store.layout.blob_path(blob.digest).read_bytes()
            assert "sha256:" + hashlib.sha256(data).hexdigest() == blob.digest and len(data) == blob.size
    leftovers = [p.name for p in root.rglob("*") if p.name.startswith((".ingest-", ".load-", ".ollama-"))]
    assert leftovers == [] and not list(root.rglob("*.tmp"))


def model_tar(tmp_path: Path, gguf: Path) -> bytes:
    """A model in DMR's tar format (what `docker model load` sends), made in a store of its own."""
    side = ModelStore(tmp_path / "side")
    built = build_artifact(PackageSpec(gguf=gguf), StoreSink(side))
    side.add_model(built.manifest_bytes, ["other"])
    return b"".join(export_chunks(side, "other"))


def no_space(response_json: object) -> str:
    """The message of a 507: Ollama's `{"error": ...}`, OpenAI's `{"error": {"message": ...}}`, or DMR's
    http.Error text."""
    if isinstance(response_json, str):
        message = response_json
    else:
        assert isinstance(response_json, dict)
        error = response_json["error"]
        message = error if isinstance(error, str) else error["message"]
    assert "no space left on device" in message and "/" not in message.replace("(MODELS_PATH)", "")
    return str(message)


def test_a_full_disk_is_a_507_everywhere_and_the_store_stays_intact(
    daemon: Daemon, small_store: Path, tmp_path: Path
) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    daemon.cli("package", "--gguf", str(tiny), "tiny")
    other = write_tiny_gguf(tmp_path / "other.gguf", seed=3)
    tar = model_tar(tmp_path, other)
    before, listed = contents(small_store), daemon.models()
    fill(small_store)

    # DMR routes: http.Error's text
    response = daemon.http("POST", "/models/package", json={"target": "other", "gguf": str(other)})
    assert response.status_code == 507 and response.text.startswith("no space left on device")
    no_space(response.text)
    response = daemon.http("POST", "/models/load", content=tar, headers={"content-type": "application/x-tar"})
    assert response.status_code == 507
    no_space(response.text)
    response = daemon.http("POST", "/models/tiny/tag", params={"repo": "copy", "tag": "v1"})
    assert response.status_code == 507
    no_space(response.text)
    # Ollama's: {"error": "..."}
    digest = "sha256:" + hashlib.sha256(other.read_bytes()).hexdigest()
    response = daemon.http("POST", f"/api/blobs/{digest}", content=other.read_bytes())
    assert response.status_code == 507 and set(response.json()) == {"error"}
    no_space(response.json())
    # the CLI's words
    for args in (("package", "--gguf", str(other), "other"), ("tag", "tiny", "copy:v1")):
        result = daemon.cli(*args, check=False)
        assert result.returncode == 1, args
        assert "no space left on device" in result.stderr and "Traceback" not in result.stderr, result.stderr

    assert contents(small_store) == before  # nothing lost, nothing half-written
    assert daemon.models() == listed
    events = [line for line in (daemon.home / "logs" / "daemon.log").read_text().splitlines()]
    assert any("event=storage_full" in line and "path=/models/package" in line for line in events)

    (small_store / FILLER).unlink()
    assert_consistent(small_store, daemon)
    daemon.cli("package", "--gguf", str(other), "other")  # works again once there is room
    daemon.cli("tag", "tiny", "copy:v1")
    tags = sorted(tag.rsplit("/", 1)[-1] for m in daemon.models() for tag in m["tags"])
    assert tags == ["copy:v1", "other:latest", "tiny:latest"]
    assert_consistent(small_store, daemon)
    response = daemon.http(
        "POST",
        "/engines/v1/chat/completions",
        json={"model": "absent", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 404 and json.loads(response.text)["error"]["message"]


def test_a_model_is_removed_from_a_full_disk(daemon: Daemon, small_store: Path, tmp_path: Path) -> None:
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "tiny.gguf")), "tiny")
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "other.gguf", seed=3)), "other")
    [tiny] = [m for m in daemon.models() if any(t.endswith("/tiny:latest") for t in m["tags"])]
    blobs = {p.name for p in (small_store / "blobs" / "sha256").iterdir()}
    fill(small_store)

    result = daemon.cli("rm", "tiny")
    assert tiny["id"] in result.stdout
    assert [m["tags"] for m in daemon.models()] == [["docker.io/ai/other:latest"]]
    assert {p.name for p in (small_store / "blobs" / "sha256").iterdir()} < blobs  # its space is free
    assert_consistent(small_store, daemon)
    assert daemon.http("DELETE", "/models/other").status_code == 200  # the API route too
    assert daemon.models() == []
    assert_consistent(small_store, daemon)
