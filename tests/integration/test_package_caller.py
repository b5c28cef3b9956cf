"""`POST /models/package` reads files by path only for the daemon's own user: another local user (a client
run as uid 65534 with setpriv) cannot make it read a file that user could not read, and `model package`
then uploads what that user can read instead. DMR's tar upload (`/models/load`) stays open to everyone."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.store.archive import export_chunks
from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, free_port, snapshot
from tests.models import write_tiny_gguf
from tests.users import OTHER_UID, as_other_user

REQUEST = r"""
import json, sys, urllib.error, urllib.request
url, body, headers = sys.argv[1], sys.argv[2].encode(), json.loads(sys.argv[3])
request = urllib.request.Request(url, data=body, headers=headers, method="POST")
try:
    with urllib.request.urlopen(request) as response:
        print(json.dumps({"status": response.status, "body": response.read().decode()}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "body": error.read().decode()}))
"""


def post_as_other_user(url: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", **(headers or {})}
    result = as_other_user(sys.executable, "-c", REQUEST, url, json.dumps(body), json.dumps(headers))
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    return answer["status"], answer["body"]


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A folder every user can enter (pytest's own tmp folders are private to root): a world-readable
    GGUF, and a file only root can read."""
    folder = Path(tempfile.mkdtemp(prefix="modelrunner-shared-"))
    folder.chmod(0o755)
    write_tiny_gguf(folder / "public.gguf", seed=4).chmod(0o644)
    secret = folder / "secret.txt"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = Daemon(tmp_path / "home", free_port()).start()
    yield running
    running.stop()


def test_another_user_cannot_make_the_daemon_read_files(daemon: Daemon, shared: Path) -> None:
    before = snapshot(daemon.store_root)
    url = daemon.url + "/models/package"
    secret_as_license = {
        "target": "stolen",
        "gguf": str(shared / "public.gguf"),
        "licenses": [str(shared / "secret.txt")],
    }
    status, body = post_as_other_user(url, secret_as_license)
    assert status == 403, body
    message = json.loads(body)["error"]["message"]
    assert "only for the user it runs as" in message and "model package" in message
    # not even a file that user could read: the daemon reads nothing on anyone else's behalf
    status, _ = post_as_other_user(url, {"target": "mine", "gguf": str(shared / "public.gguf")})
    assert status == 403
    status, _ = post_as_other_user(
        url, {"target": "mine", "gguf": str(shared / "public.gguf")}, {"X-Model-Runner-Token": "guess"}
    )
    assert status == 403
    assert snapshot(daemon.store_root) == before
    assert daemon.models() == []

    # the daemon's own user still can, secret file included
    response = daemon.http("POST", "/models/package", json=secret_as_license)
    assert response.status_code == 201, response.text


def test_model_package_as_another_user_uploads_what_that_user_can_read(daemon: Daemon, shared: Path) -> None:
    docker_config = shared / "docker"  # the other user's own (DMR's contexts.json lives there)
    docker_config.mkdir()
    os.chown(docker_config, OTHER_UID, OTHER_UID)
    env = {**daemon.env, "HOME": "/tmp", "DOCKER_CONFIG": str(docker_config)}
    refused = as_other_user(
        sys.executable, "-m", "modelrunner", "package", "--gguf", str(shared / "public.gguf"),
        "--license", str(shared / "secret.txt"), "stolen",
        env=env,
    )  # fmt: skip
    assert refused.returncode == 1 and "secret.txt" in refused.stderr, refused.stderr
    assert daemon.models() == []
    done = as_other_user(
        sys.executable, "-m", "modelrunner", "package", "--gguf", str(shared / "public.gguf"), "mine", env=env
    )
    assert done.returncode == 0, done.stderr
    [model] = daemon.models()
    assert model["tags"] == ["ai/mine:latest"] or model["tags"][0].endswith("/mine:latest")


def test_the_tar_upload_of_dmr_stays_open_to_every_local_user(
    daemon: Daemon, shared: Path, tmp_path: Path
) -> None:
    side = ModelStore(tmp_path / "side")
    from modelrunner.artifact.builder import PackageSpec, build_artifact
    from modelrunner.store.sink import StoreSink

    built = build_artifact(PackageSpec(gguf=shared / "public.gguf"), StoreSink(side))
    side.add_model(built.manifest_bytes, ["x"])
    tar = shared / "model.tar"
    tar.write_bytes(b"".join(export_chunks(side, "x")))
    tar.chmod(0o644)
    code = (
        "import sys, urllib.request\n"
        "data = open(sys.argv[2], 'rb').read()\n"
        "request = urllib.request.Request(sys.argv[1], data=data, method='POST')\n"
        "print(urllib.request.urlopen(request).read().decode())"
    )
    result = as_other_user(sys.executable, "-c", code, daemon.url + "/models/load", str(tar))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["type"] == "success"
    assert len(daemon.models()) == 1
