"""The daemon's model API over real HTTP, against a real `model serve` process."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from modelrunner.artifact import mediatypes as mt
from tests.daemon import Daemon, Daemons, error_message, json_lines, snapshot
from tests.models import write_tiny_dduf, write_tiny_gguf, write_tiny_gguf_shards, write_tiny_safetensors_dir


def package(daemon: Daemon, target: str, **sources: object) -> str:
    response = daemon.http("POST", "/models/package", json={"target": target, **sources})
    assert response.status_code == 201, response.text
    model_id: str = response.json()["id"]
    return model_id


def test_root_version_and_df(daemon: Daemon) -> None:
    assert daemon.http("GET", "/").text == "Docker Model Runner is running"
    assert daemon.http("GET", "/version").json()["version"]
    usage = daemon.http("GET", "/engines/df").json()
    # DMR's DiskUsage, and ours: the saved prompt caches of warm resume (a Go client ignores the extra key)
    assert set(usage) == {"models_disk_usage", "default_backend_disk_usage", "kv_cache_disk_usage"}


def test_package_list_inspect_shapes(daemon: Daemon, tiny_gguf: Path) -> None:
    model_id = package(daemon, "tiny", gguf=str(tiny_gguf))
    assert model_id.startswith("sha256:") and len(model_id) == 71
    [model] = daemon.models()
    assert model["id"] == model_id
    assert model["tags"] == ["docker.io/ai/tiny:latest"]
    assert isinstance(model["created"], int) and model["created"] > 0
    config = model["config"]
    assert config["format"] == "gguf"
    assert config["architecture"] == "llama"
    assert config["quantization"] == "MOSTLY_F32"  # gguf-parser's file type name, as DMR stores it
    assert config["context_size"] == 512
    assert config["parameters"].endswith("K")
    assert config["gguf"]["general.architecture"] == "llama"
    for name in (
        "tiny",
        "ai/tiny",
        "ai/tiny:latest",
        "docker.io/ai/tiny:latest",
        model_id,
        model_id[7:19],
    ):
        assert daemon.http("GET", f"/models/{name}").json()["id"] == model_id


def test_manifest_and_config_follow_the_contract(daemon: Daemon, tiny_gguf: Path) -> None:
    model_id = package(daemon, "tiny", gguf=str(tiny_gguf))
    hex_id = model_id.removeprefix("sha256:")
    manifest_path = daemon.store_root / "manifests" / "sha256" / hex_id
    manifest = json.loads(manifest_path.read_bytes())
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == mt.OCI_MANIFEST
    assert manifest["config"]["mediaType"] == mt.CONFIG_V01
    [layer] = manifest["layers"]
    assert layer["mediaType"] == mt.GGUF
    assert layer["annotations"][mt.ANNOTATION_FILEPATH] == "tiny.gguf"
    blob = daemon.store_root / "blobs" / "sha256" / layer["digest"].removeprefix("sha256:")
    assert blob.read_bytes() == tiny_gguf.read_bytes()
    config = json.loads(
        (daemon.store_root / "blobs" / "sha256" / manifest["config"]["digest"][7:]).read_bytes()
    )
    assert config["rootfs"] == {"type": "rootfs", "diff_ids": [layer["digest"]]}
    assert config["descriptor"]["created"].endswith("Z")
    layout = json.loads((daemon.store_root / "layout.json").read_text())
    assert layout == {"version": "1.0.0"}
    index = json.loads((daemon.store_root / "models.json").read_text())
    assert index["models"][0]["files"] == [layer["digest"], manifest["config"]["digest"]]


def test_package_every_format(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    shards = write_tiny_gguf_shards(tmp_path / "shards", n=2)
    st_dir = write_tiny_safetensors_dir(tmp_path / "st")
    dduf = write_tiny_dduf(tmp_path / "x.dduf")
    package(daemon, "sharded", gguf=str(shards[1]))
    package(daemon, "st", safetensors_dir=str(st_dir))
    package(daemon, "img", dduf=str(dduf))
    formats = {m["tags"][0]: m["config"]["format"] for m in daemon.models()}
    assert formats == {
        "docker.io/ai/sharded:latest": "gguf",
        "docker.io/ai/st:latest": "safetensors",
        "docker.io/ai/img:latest": "dduf",
    }


def test_tag_moves_and_delete(daemon: Daemon, tmp_path: Path) -> None:
    first = package(daemon, "one", gguf=str(write_tiny_gguf(tmp_path / "a.gguf", seed=1)))
    second = package(daemon, "two", gguf=str(write_tiny_gguf(tmp_path / "b.gguf", seed=2)))
    response = daemon.http("POST", "/models/one/tag", params={"repo": "myorg/shared", "tag": "v1"})
    assert response.status_code == 201
    assert response.json()["target"] == "myorg/shared:v1"  # as given, as DMR's handleTagModel
    response = daemon.http("POST", "/models/two/tag", params={"repo": "myorg/shared", "tag": "v1"})
    assert response.status_code == 201
    tags = {m["id"]: m["tags"] for m in daemon.models()}
    assert tags[first] == ["docker.io/ai/one:latest"]
    assert "docker.io/myorg/shared:v1" in tags[second]

    response = daemon.http("DELETE", f"/models/{second}")
    assert response.status_code == 409
    assert "force" in error_message(response)
    response = daemon.http("DELETE", "/models/myorg/shared:v1")
    assert response.json() == [{"Untagged": "docker.io/myorg/shared:v1"}]
    response = daemon.http("DELETE", "/models/two")
    assert response.json() == [{"Untagged": "docker.io/ai/two:latest"}, {"Deleted": second}]
    assert [m["id"] for m in daemon.models()] == [first]


def test_repackage_context_size(daemon: Daemon, tiny_gguf: Path) -> None:
    source = package(daemon, "tiny", gguf=str(tiny_gguf))
    response = daemon.http("POST", "/models/tiny/repackage", json={"target": "tiny:ctx", "context_size": 128})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body == {  # http_handler.go handleRepackageModel
        "message": 'Model repackaged successfully as "tiny:ctx"',
        "source": "tiny",
        "target": "tiny:ctx",
    }
    new = daemon.http("GET", "/models/tiny:ctx").json()
    assert new["id"] != source and new["config"]["context_size"] == 128
    old_layers = {p.name for p in (daemon.store_root / "blobs" / "sha256").iterdir()}
    assert len(old_layers) == 3  # the GGUF blob is shared; two configs


def test_export_then_load_on_an_empty_store_restores_the_same_id(
    daemons: Daemons, daemon: Daemon, tmp_path: Path
) -> None:
    st_dir = write_tiny_safetensors_dir(tmp_path / "st")
    model_id = package(daemon, "st", safetensors_dir=str(st_dir))
    archive = daemon.http("GET", "/models/st/export")
    assert archive.status_code == 200
    assert archive.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        names = tar.getnames()
    assert names[-1] == "manifest.json" and all(n.startswith("blobs/sha256/") for n in names[:-1])

    other = daemons.start(tmp_path / "other")
    response = other.http("POST", "/models/load", content=archive.content)
    assert response.status_code == 200, response.text
    assert json_lines(response.text)[-1]["id"] == model_id
    [loaded] = other.models()
    assert loaded["id"] == model_id and loaded["tags"] == []


def test_purge(daemon: Daemon, tiny_gguf: Path) -> None:
    package(daemon, "tiny", gguf=str(tiny_gguf))
    assert daemon.http("DELETE", "/models/purge").status_code == 200
    assert daemon.models() == []
    assert (daemon.store_root / "layout.json").is_file()


def _bad_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("../escape")
        info.size = 4
        archive.addfile(info, io.BytesIO(b"evil"))
    return buffer.getvalue()


BAD_REQUESTS = [
    ("GET", "/models/ai/Bad$Name", {}, 400),
    ("GET", "/models/%2e%2e/etc", {}, 400),
    ("GET", "/models/ai/absent", {}, 404),
    ("GET", "/models/sha256:" + "0" * 64, {}, 404),
    ("GET", "/models/sha256:ABC", {}, 400),
    ("DELETE", "/models/absent", {}, 404),
    ("POST", "/models/tiny/tag?repo=..%2Fevil&tag=x", {}, 400),
    ("POST", "/models/tiny/tag?repo=ok&tag=bad%20tag", {}, 400),
    ("POST", "/models/tiny/tag?repo=ok&tag=x%40sha256%3Aabc", {}, 400),
    ("POST", "/models/absent/tag?repo=ok&tag=v1", {}, 404),
    (
        "POST",
        "/models/tiny/repackage",
        {"content": b"{not json", "headers": {"content-type": "application/json"}},
        400,
    ),
    ("POST", "/models/tiny/repackage", {"json": {"target": "t", "context_size": -1}}, 400),
    ("POST", "/models/tiny/repackage", {"json": {"target": ""}}, 400),
    ("POST", "/models/tiny/repackage", {"json": {"target": "t", "extra": 1}}, 400),
    ("POST", "/models/load", {"content": b"this is not a tar archive" * 40}, 400),
    ("POST", "/models/load", {"content": _bad_tar()}, 400),
    ("POST", "/models/package", {"json": {"target": "x", "gguf": "relative/path.gguf"}}, 400),
    ("POST", "/models/package", {"json": {"target": "x", "gguf": "/nonexistent/model.gguf"}}, 400),
    ("POST", "/models/package", {"json": {"target": "x"}}, 400),
    ("POST", "/models/package", {"json": {"target": "Bad..Ref", "gguf": "/dev/null"}}, 400),
    ("POST", "/models/package", {"json": {"target": "x", "context_size": 0}}, 400),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status"), BAD_REQUESTS)
def test_bad_requests_get_a_clear_error_and_change_nothing(
    daemon: Daemon, tiny_gguf: Path, method: str, path: str, kwargs: dict[str, object], status: int
) -> None:
    package(daemon, "tiny", gguf=str(tiny_gguf))
    before = snapshot(daemon.store_root)
    response = daemon.http(method, path, **kwargs)
    assert response.status_code == status, response.text
    message = error_message(response)
    assert str(daemon.home) not in message and len(message) < 500
    assert snapshot(daemon.store_root) == before


BAD_FILES = ["directory", "fifo", "device", "truncated", "hostile_count", "incomplete_shards", "not_gguf"]


@pytest.mark.parametrize("kind", BAD_FILES)
def test_bad_model_files_are_refused_and_change_nothing(daemon: Daemon, tmp_path: Path, kind: str) -> None:
    good = write_tiny_gguf(tmp_path / "good.gguf")
    if kind == "directory":
        path = tmp_path / "dir.gguf"
        path.mkdir()
    elif kind == "fifo":
        path = tmp_path / "pipe.gguf"
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    elif kind == "truncated":
        path = tmp_path / "cut.gguf"
        path.write_bytes(good.read_bytes()[:1000])
    elif kind == "hostile_count":
        data = bytearray(good.read_bytes())
        data[8:16] = (2**62).to_bytes(8, "little")  # tensor count far beyond the file
        path = tmp_path / "hostile.gguf"
        path.write_bytes(bytes(data))
    elif kind == "incomplete_shards":
        (tmp_path / "shards").mkdir()
        shards = write_tiny_gguf_shards(tmp_path / "shards", n=3)
        shards[1].unlink()
        path = shards[0]
    else:
        path = tmp_path / "text.gguf"
        path.write_text("hello, I am not a model\n" * 100)
    before = snapshot(daemon.store_root)
    response = daemon.http("POST", "/models/package", json={"target": "bad", "gguf": str(path)})
    assert response.status_code == 400, response.text
    message = error_message(response)
    assert str(tmp_path) not in message
    assert snapshot(daemon.store_root) == before


def test_bad_extra_files_leave_no_blobs_behind(daemon: Daemon, tiny_gguf: Path, tmp_path: Path) -> None:
    template = tmp_path / "template.jinja"
    template.write_bytes(b"\xff\xfe not utf-8")
    before = snapshot(daemon.store_root)
    response = daemon.http(
        "POST",
        "/models/package",
        json={"target": "x", "gguf": str(tiny_gguf), "chat_template": str(template)},
    )
    assert response.status_code == 400
    assert "UTF-8" in error_message(response)
    assert snapshot(daemon.store_root) == before
