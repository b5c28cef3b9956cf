"""`POST /models/package` reads files by path only for the daemon's own user: another local user (a client
run as uid 65534 with setpriv) cannot make it read a file that user could not read, not even with the
daemon's token, and `model package` then uploads what that user can read instead. The CLI sends the token
to no listener but its own user's daemon. DMR's tar upload (`/models/load`) stays open to everyone."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner import config
from modelrunner.client import Client
from modelrunner.errors import DaemonError
from modelrunner.server.localuser import ensure_token
from modelrunner.store.archive import export_chunks
from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, free_port, snapshot
from tests.models import write_tiny_gguf
from tests.users import OTHER_UID, as_other_user, other_user_process, post_as_other_user

# A stand-in for a daemon, on a TCP port or a Unix socket: prints the head of the one request it gets, then
# refuses it (403, as a daemon refuses a caller who is not its user).
LISTENER = r"""
import json, socket, sys
where = sys.argv[1]
server = socket.socket(socket.AF_UNIX) if where.startswith("/") else socket.socket()
server.bind(where if where.startswith("/") else ("127.0.0.1", int(where)))
server.listen()
print("listening", flush=True)
connection, _ = server.accept()
head = b""
while b"\r\n\r\n" not in head and (chunk := connection.recv(65536)):
    head += chunk
print(json.dumps(head.decode("latin-1")), flush=True)
body = b'{"error": {"code": 403, "message": "refused"}}'
connection.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
connection.close()
"""

# A request sent, then its connection closed at once, without waiting for the answer.
SEND_AND_CLOSE = r"""
import socket, sys
port, body, token = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
extra = f"X-Model-Runner-Token: {token}\r\n".encode() if token else b""
head = (b"POST /models/package HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + extra + b"Content-Length: %d\r\n\r\n" % len(body))
with socket.create_connection(("127.0.0.1", port)) as sock:
    sock.sendall(head + body)
"""


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


def test_another_user_cannot_make_the_daemon_read_files(daemon: Daemon, shared: Path) -> None:
    before = snapshot(daemon.store_root)
    url = daemon.url + "/models/package"
    secret_as_license = stealing_request(shared)
    status, body = post_as_other_user(url, secret_as_license)
    assert status == 403, body
    message = body  # http.Error's text, as DMR's routes answer
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


def package_lines(daemon: Daemon) -> list[str]:
    """The daemon's access lines of package requests."""
    return [line for line in daemon.log.read_text().splitlines() if "path=/models/package " in line]


def stealing_request(shared: Path) -> dict[str, object]:
    """A package request that would make the daemon read root's secret as a licence file."""
    return {"target": "stolen", "gguf": str(shared / "public.gguf"), "licenses": [str(shared / "secret.txt")]}


def test_the_token_does_not_let_another_user_in(daemon: Daemon, shared: Path) -> None:
    """The token leaked to another user (a listener it ran got it, say): on a TCP connection the caller's
    user decides, whatever token it sends, even once it has closed its end of the connection (Linux then
    lists that end as uid 0)."""
    token = (daemon.home / "daemon.token").read_text().strip()
    secret_as_license = stealing_request(shared)
    status, body = post_as_other_user(
        daemon.url + "/models/package", secret_as_license, {"X-Model-Runner-Token": token}
    )
    assert status == 403, body
    for sent in ("", token):
        seen = len(package_lines(daemon))
        closed = as_other_user(
            sys.executable, "-c", SEND_AND_CLOSE, str(daemon.port), json.dumps(secret_as_license), sent
        )
        assert closed.returncode == 0, closed.stderr
        deadline = time.monotonic() + 60
        while len(package_lines(daemon)) == seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "status=403" in package_lines(daemon)[-1]
    assert daemon.models() == []


def test_a_forged_client_address_does_not_make_another_user_the_daemons(daemon: Daemon, shared: Path) -> None:
    """The caller's user is looked up by its connection's real address: an X-Forwarded-For naming the
    address of a connection of the daemon's user (here one following the logs) is no way in."""
    with socket.create_connection(("127.0.0.1", daemon.port)) as held:
        held.sendall(b"GET /logs?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert held.recv(12) == b"HTTP/1.1 200"
        address = "{}:{}".format(*held.getsockname())
        request = stealing_request(shared)
        status, body = post_as_other_user(
            daemon.url + "/models/package", request, {"X-Forwarded-For": address}
        )
        assert status == 403, body
    assert daemon.models() == []


@contextlib.contextmanager
def listening(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    try:
        assert process.stdout is not None and process.stdout.readline() == "listening\n"
        yield process
    finally:
        process.kill()
        process.wait()


def head_heard(listener: subprocess.Popen[str], client: Client, request: dict[str, object]) -> str:
    """The head of the package request `client` sent, as `listener` got it (it refuses the request)."""
    with pytest.raises(DaemonError) as refused:
        client.package(request)
    assert refused.value.status_code == 403
    assert listener.stdout is not None
    head = json.loads(listener.stdout.readline())
    assert isinstance(head, str) and head.startswith("POST /models/package ")
    return head


@pytest.fixture
def token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The token of this user's runner home, as `model serve` makes it."""
    monkeypatch.setenv("MODEL_RUNNER_HOME", str(tmp_path / "home"))
    return ensure_token(config.local_token_file())


def test_the_cli_never_sends_the_token_to_a_listener_of_another_user(token: str, shared: Path) -> None:
    request: dict[str, object] = {"target": "x", "gguf": str(shared / "public.gguf")}
    port = free_port()
    with listening(other_user_process(sys.executable, "-c", LISTENER, str(port))) as listener:
        head = head_heard(listener, Client(f"http://127.0.0.1:{port}"), request)
    assert token not in head and "token" not in head.lower()
    sockets = shared / "sockets"
    sockets.mkdir()
    os.chown(sockets, OTHER_UID, OTHER_UID)
    path = sockets / "runner.sock"
    with listening(other_user_process(sys.executable, "-c", LISTENER, str(path))) as listener:
        head = head_heard(listener, Client(f"unix://{path}"), request)
    assert token not in head and "token" not in head.lower()


def test_the_cli_sends_the_token_only_where_its_own_daemon_needs_it(token: str, tmp_path: Path) -> None:
    """Over a Unix socket the daemon cannot tell who connects: the token says it, to a listener of this
    user. Over TCP the daemon knows its caller's user from the connection: the token stays home."""
    request: dict[str, object] = {"target": "x", "gguf": "/nowhere.gguf"}
    path = tmp_path / "runner.sock"
    listener_argv = [sys.executable, "-c", LISTENER, str(path)]
    with listening(subprocess.Popen(listener_argv, stdout=subprocess.PIPE, text=True)) as listener:
        head = head_heard(listener, Client(f"unix://{path}"), request)
    assert f"X-Model-Runner-Token: {token}\r\n" in head
    port = free_port()
    listener_argv = [sys.executable, "-c", LISTENER, str(port)]
    with listening(subprocess.Popen(listener_argv, stdout=subprocess.PIPE, text=True)) as listener:
        head = head_heard(listener, Client(f"http://127.0.0.1:{port}"), request)
    assert token not in head


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
