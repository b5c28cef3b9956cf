"""Interop with a client nobody here wrote: skopeo copies what `model push` sent, and `model pull` takes
what skopeo pushed in DMR's format."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.artifact import mediatypes as mt
from tests.daemon import Daemon, Daemons, json_lines
from tests.models import write_tiny_gguf
from tests.registry import Registry, require_tool


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    running = Registry(tmp_path / "registry").start()
    yield running
    running.stop()


@pytest.fixture
def daemon(daemons: Daemons, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    return daemons.start()


def skopeo(*args: str) -> subprocess.CompletedProcess[str]:
    require_tool("skopeo", "skopeo")
    result = subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


def test_skopeo_copies_what_model_push_sent(registry: Registry, daemon: Daemon, tmp_path: Path) -> None:
    ref = f"{registry.host}/team/tiny:v1"
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    daemon.cli("package", "--gguf", str(gguf), "--push", ref)
    copy = tmp_path / "copy"
    skopeo("copy", "--src-tls-verify=false", f"docker://{ref}", f"dir:{copy}")
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["mediaType"] == mt.OCI_MANIFEST
    assert manifest["config"]["mediaType"] == mt.CONFIG_V01
    assert [layer["mediaType"] for layer in manifest["layers"]] == [mt.GGUF]
    layer_hex = manifest["layers"][0]["digest"].removeprefix("sha256:")
    assert (copy / layer_hex).read_bytes() == gguf.read_bytes()
    inspected = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{ref}").stdout)
    assert inspected == manifest


def write_oci_layout(folder: Path, blobs: dict[str, bytes], manifest: bytes, tag: str) -> None:
    """An OCI image layout (what `skopeo copy oci:...` reads) holding one manifest."""
    import hashlib

    (folder / "blobs/sha256").mkdir(parents=True)
    for digest, data in blobs.items():
        (folder / "blobs/sha256" / digest.removeprefix("sha256:")).write_bytes(data)
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    (folder / "blobs/sha256" / manifest_digest.removeprefix("sha256:")).write_bytes(manifest)
    (folder / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": mt.OCI_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (folder / "index.json").write_text(json.dumps(index))


def test_model_pull_takes_what_skopeo_pushed(registry: Registry, daemon: Daemon, tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    model_id = daemon.http("POST", "/models/package", json={"target": "scratch", "gguf": str(gguf)}).json()[
        "id"
    ]
    manifest = (daemon.store_root / "manifests/sha256" / model_id[7:]).read_bytes()
    doc = json.loads(manifest)
    blobs = {
        d["digest"]: (daemon.store_root / "blobs/sha256" / d["digest"][7:]).read_bytes()
        for d in [*doc["layers"], doc["config"]]
    }
    daemon.cli("rm", "scratch")
    layout = tmp_path / "layout"
    write_oci_layout(layout, blobs, manifest, "v1")
    ref = f"{registry.host}/skopeo/tiny:v1"
    skopeo("copy", "--dest-tls-verify=false", "--preserve-digests", f"oci:{layout}:v1", f"docker://{ref}")

    result = daemon.cli("pull", ref, "--json")
    assert json_lines(result.stdout)[-1]["message"] == "Model pulled successfully"
    listing = daemon.cli("ls").stdout
    assert f"{registry.host}/skopeo/tiny:v1" in listing
    [model] = daemon.models()
    assert model["id"] == model_id  # same bytes: skopeo kept the manifest as it was
    assert model["config"]["format"] == "gguf" and model["config"]["architecture"] == "llama"
