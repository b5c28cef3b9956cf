"""Pull and push against a real `docker-registry` (no auth, htpasswd, token auth), through a proxy that
counts bytes and misbehaves on request."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.artifact import mediatypes as mt
from modelrunner.distribution.progress import ProgressReporter
from modelrunner.distribution.pull import RegistryPull
from modelrunner.reference import parse_reference
from modelrunner.store.store import ModelStore
from tests.daemon import Daemon, Daemons, error_message, free_port, json_lines, snapshot
from tests.models import write_tiny_gguf
from tests.registry import Registry, RegistryProxy, docker_config


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never the machine's own ~/.docker credentials or registry settings."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    for name in ("INSECURE_REGISTRY", "MODEL_RUNNER_REGISTRY_MIRRORS", "DEFAULT_REGISTRY", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def start_registry(tmp_path: Path, auth: str, **options: Any) -> Registry:
    return Registry(tmp_path / f"registry-{auth}", auth=auth, **options).start()


@pytest.fixture(params=["none", "htpasswd", "token"])
def registry(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Registry]:
    running = start_registry(tmp_path, request.param)
    if request.param != "none":
        for host in (running.host,):
            monkeypatch.setenv(
                "DOCKER_CONFIG", str(docker_config(tmp_path / "docker", host, "alice", "wonderland"))
            )
    yield running
    running.stop()


@pytest.fixture
def plain_registry(tmp_path: Path) -> Iterator[Registry]:
    running = start_registry(tmp_path, "none")
    yield running
    running.stop()


def proxy_for(registry: Registry) -> RegistryProxy:
    return RegistryProxy(registry.host).start()


@pytest.fixture
def proxy(request: pytest.FixtureRequest) -> Iterator[RegistryProxy]:
    names = request.fixturenames
    target: Registry = request.getfixturevalue("registry" if "registry" in names else "plain_registry")
    running = proxy_for(target)
    yield running
    running.stop()


def with_credentials_for(host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, password: str) -> None:
    monkeypatch.setenv(
        "DOCKER_CONFIG", str(docker_config(tmp_path / "docker-proxy", host, "alice", password))
    )


def package(daemon: Daemon, gguf: Path, target: str) -> str:
    response = daemon.http("POST", "/models/package", json={"target": target, "gguf": str(gguf)})
    assert response.status_code == 201, response.text
    model_id: str = response.json()["id"]
    return model_id


def pull(daemon: Daemon, ref: str, **body: Any) -> httpx.Response:
    return daemon.http(
        "POST",
        "/models/create",
        json={"from": ref, **body},
        headers={"Accept": "application/json"},
        timeout=120,
    )


def push(daemon: Daemon, ref: str) -> httpx.Response:
    return daemon.http("POST", f"/models/{ref}/push", headers={"Accept": "application/json"}, timeout=120)


def last_event(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return json_lines(response.text)[-1]


def layer_digest(daemon: Daemon, model_id: str) -> tuple[str, int]:
    manifest = json.loads((daemon.store_root / "manifests/sha256" / model_id[7:]).read_bytes())
    layer = manifest["layers"][0]
    return layer["digest"], layer["size"]


def tiny_layer(tmp_path: Path) -> tuple[str, int]:
    """Digest and size of the tiny model's one layer (the GGUF file written by pushed_model)."""
    import hashlib

    data = (tmp_path / "tiny.gguf").read_bytes()
    return "sha256:" + hashlib.sha256(data).hexdigest(), len(data)


def pushed_model(daemon: Daemon, tmp_path: Path, ref: str) -> str:
    """Package the tiny model as `ref`, push it, and remove it locally; returns its ID."""
    model_id = package(daemon, write_tiny_gguf(tmp_path / "tiny.gguf"), ref)
    assert last_event(push(daemon, ref))["type"] == "success"
    daemon.cli("rm", ref)
    return model_id


# --- round trips -------------------------------------------------------------------------------------------


def test_push_then_pull_round_trip(
    registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = f"{proxy.host}/team/tiny:v1"
    if registry.auth != "none":
        with_credentials_for(proxy.host, tmp_path, monkeypatch, "wonderland")
        daemon.stop()
        daemon.start()
    model_id = package(daemon, write_tiny_gguf(tmp_path / "tiny.gguf"), ref)
    pushed = daemon.cli("push", ref)
    assert "Model pushed successfully" in pushed.stdout
    daemon.cli("rm", ref)

    response = pull(daemon, ref)
    events = json_lines(response.text)
    assert response.headers["content-type"].startswith("application/json")
    assert events[-1] == {
        "type": "success",
        "message": "Model pulled successfully",
        "total": 0,
        "layer": {"size": 0, "current": 0},
        "mode": "pull",
    }
    progress = [e for e in events if e["type"] == "progress" and e["layer"].get("id")]
    assert progress and all(e["mode"] == "pull" and e["message"].startswith("Downloaded: ") for e in progress)
    digest, size = layer_digest(daemon, model_id)
    assert {"id": digest, "size": size, "current": size} in [e["layer"] for e in progress]
    [model] = daemon.models()
    assert model["id"] == model_id and model["tags"] == [ref]

    proxy.reset_counts()
    again = json_lines(pull(daemon, ref).text)
    assert again[-1]["type"] == "success" and again[-1]["message"].startswith("Using cached model: ")
    assert proxy.blob_bytes == 0 and proxy.ranges == []


def test_text_stream_is_html_escaped_json(plain_registry: Registry, daemon: Daemon, tmp_path: Path) -> None:
    ref = f"{plain_registry.host}/team/tiny:v1"
    pushed_model(daemon, tmp_path, ref)
    response = daemon.http("POST", "/models/create", json={"from": ref}, timeout=120)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.headers["cache-control"] == "no-cache"
    lines = response.text.splitlines()
    assert lines[-1].startswith("{&#34;type&#34;:&#34;success&#34;")
    import html

    assert json.loads(html.unescape(lines[-1]))["message"] == "Model pulled successfully"


def test_cli_pull_plain_and_json_output(plain_registry: Registry, daemon: Daemon, tmp_path: Path) -> None:
    ref = f"{plain_registry.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    plain = daemon.cli("pull", ref)
    assert plain.stdout.splitlines()[-1] == "Model pulled successfully"
    as_json = daemon.cli("pull", ref, "--json")
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert events[-1]["message"].startswith("Using cached model")
    assert daemon.models()[0]["id"] == model_id


def test_package_with_push(plain_registry: Registry, daemon: Daemon, tmp_path: Path) -> None:
    ref = f"{plain_registry.host}/myorg/mymodel:Q4_K_M"
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    result = daemon.cli("package", "--gguf", str(gguf), "--push", ref)
    assert result.stderr.endswith("Pushing model to registry...\n\nModel pushed successfully\n")
    tags = httpx.get(f"{plain_registry.url}/v2/myorg/mymodel/tags/list").json()["tags"]
    assert tags == ["Q4_K_M"]


# --- resume ------------------------------------------------------------------------------------------------


def wait_for_partial(daemon: Daemon, digest: str, size: int) -> Path:
    partial = daemon.store_root / "blobs/sha256" / (digest[7:] + ".incomplete")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if partial.exists() and partial.stat().st_size == size:
            return partial
        time.sleep(0.02)
    raise AssertionError(f"partial never reached {size} bytes")


def background_pull(daemon: Daemon, ref: str) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the daemon is killed under it
            pull(daemon, ref)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_resume_after_the_daemon_is_killed(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    ref = f"{proxy.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    digest, size = tiny_layer(tmp_path)
    held = 200_000
    proxy.controls.hold_after = held
    thread = background_pull(daemon, ref)
    wait_for_partial(daemon, digest, held)
    assert daemon.process is not None
    daemon.process.kill()
    daemon.process.wait()
    proxy.controls.hold_after = None
    proxy.controls.release.set()
    thread.join(30)

    proxy.reset_counts()
    daemon.start()
    assert last_event(pull(daemon, ref))["type"] == "success"
    assert proxy.ranges == [f"bytes={held}-"]  # the config blob was already complete
    assert proxy.blob_bytes == size - held
    assert daemon.models()[0]["id"] == model_id
    assert not list((daemon.store_root / "blobs/sha256").glob("*.incomplete"))


def test_ctrl_c_cancels_and_leaves_a_resumable_partial(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    ref = f"{proxy.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    digest, size = tiny_layer(tmp_path)
    held = 150_000
    proxy.controls.hold_after = held
    cli = subprocess.Popen(
        [sys.executable, "-m", "modelrunner", "pull", ref],
        env=daemon.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as at a terminal: a test run started in the background (`cmd &` in a script) ignores SIGINT, the
        # CLI would inherit that and Python would then never raise KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for_partial(daemon, digest, held)
    cli.send_signal(signal.SIGINT)
    _, stderr = cli.communicate(timeout=60)
    assert cli.returncode == 130
    assert "cancelled" in stderr and "resume" in stderr
    # the daemon sees its last client leave (transfers.TransferJob.detach) before the held blob goes on: else
    # the cancelled job may still ask for the rest once, and its bytes would count with the new pull's
    deadline = time.monotonic() + 60
    while "went away: cancelling" not in daemon.log.read_text():
        assert time.monotonic() < deadline, "the daemon never cancelled the pull of the client that left"
        time.sleep(0.05)
    proxy.controls.hold_after = None
    proxy.controls.release.set()
    assert daemon.models() == []

    proxy.reset_counts()
    assert last_event(pull(daemon, ref))["type"] == "success"
    assert proxy.blob_bytes == size - held
    assert daemon.models()[0]["id"] == model_id


def plant_partial(daemon: Daemon, digest: str, data: bytes) -> Path:
    partial = daemon.store_root / "blobs/sha256" / (digest[7:] + ".incomplete")
    partial.write_bytes(data)
    return partial


def test_partial_download_is_resumed_with_range(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    ref = f"{proxy.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    digest, size = tiny_layer(tmp_path)
    plant_partial(daemon, digest, (tmp_path / "tiny.gguf").read_bytes()[:1000])
    proxy.reset_counts()
    assert last_event(pull(daemon, ref))["type"] == "success"
    assert "bytes=1000-" in proxy.ranges
    assert proxy.blob_bytes == size - 1000 + proxy_config_bytes(daemon, model_id)


def proxy_config_bytes(daemon: Daemon, model_id: str) -> int:
    manifest = json.loads((daemon.store_root / "manifests/sha256" / model_id[7:]).read_bytes())
    size: int = manifest["config"]["size"]
    return size


def test_connection_cut_midway_is_resumed_in_the_same_pull(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    """The registry closes the connection before the announced length: the bytes that arrived stay in
    the partial and the pull asks for the rest (a cut is no end of the blob, and no bad data)."""
    ref = f"{proxy.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    _, size = tiny_layer(tmp_path)
    cut = 123_456
    proxy.reset_counts()
    proxy.controls.cut_after = cut
    assert last_event(pull(daemon, ref))["type"] == "success"
    assert proxy.ranges == [None, None, f"bytes={cut}-"]  # config, layer (cut), the layer's rest
    assert proxy.blob_bytes == size + proxy_config_bytes(daemon, model_id)
    assert daemon.models()[0]["id"] == model_id
    assert not list((daemon.store_root / "blobs/sha256").glob("*.incomplete"))


def test_pull_through_a_proxy_from_the_environment(
    plain_registry: Registry, daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY set: manifests and blobs go through the proxy (httpx's path; without one, blob bodies are
    read with http.client). In this process, so that only the pull sees the variable."""
    ref = f"{plain_registry.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    digest, size = tiny_layer(tmp_path)
    forward = proxy_for(plain_registry)  # forwards absolute-form requests to the registry
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://{forward.host}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        store = ModelStore(tmp_path / "in-process-store")
        events: list[dict[str, Any]] = []
        puller = RegistryPull(store, parse_reference(ref), ProgressReporter(events.append, "pull"))
        try:
            puller.resolve()
            assert puller.run() == model_id
        finally:
            puller.close()
    finally:
        forward.stop()
    assert ("GET", f"http://{plain_registry.host}/v2/team/tiny/blobs/{digest}") in forward.requests
    assert forward.blob_bytes >= size
    assert store.layout.blob_path(digest).stat().st_size == size
    assert events[-1]["type"] == "success"


def test_server_ignoring_range_restarts_the_blob_cleanly(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    ref = f"{proxy.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    digest, size = tiny_layer(tmp_path)
    plant_partial(daemon, digest, (tmp_path / "tiny.gguf").read_bytes()[:1000])
    proxy.controls.ignore_range = True
    proxy.reset_counts()
    assert last_event(pull(daemon, ref))["type"] == "success"
    assert proxy.blob_bytes == size + proxy_config_bytes(daemon, model_id)
    assert daemon.models()[0]["id"] == model_id


def test_retries_after_503(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    ref = f"{proxy.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    proxy.controls.fail_blob_gets = [503, 502, 504]
    assert last_event(pull(daemon, ref))["type"] == "success"
    assert daemon.models()[0]["id"] == model_id


# --- bad registries and bad data ---------------------------------------------------------------------------


def test_blob_corrupted_on_the_registry_disk(
    plain_registry: Registry, daemon: Daemon, tmp_path: Path
) -> None:
    ref = f"{plain_registry.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    digest, _ = layer_digest_from_registry(plain_registry, "team/tiny", "v1")
    data_path = plain_registry.blob_data_path(digest)
    data = bytearray(data_path.read_bytes())
    data[5000] ^= 0xFF
    data_path.write_bytes(bytes(data))
    before = snapshot(daemon.store_root)

    response = pull(daemon, ref)
    event = last_event(response)
    assert event["type"] == "error" and "does not match its digest" in event["message"]
    assert snapshot(daemon.store_root) == before
    assert daemon.models() == []
    assert model_id


def layer_digest_from_registry(registry: Registry, repository: str, tag: str) -> tuple[str, int]:
    manifest = httpx.get(
        f"{registry.url}/v2/{repository}/manifests/{tag}", headers={"Accept": mt.OCI_MANIFEST}
    ).json()
    return manifest["layers"][0]["digest"], manifest["layers"][0]["size"]


@pytest.mark.parametrize("auth", ["htpasswd", "token"])
def test_wrong_credentials_give_a_clear_401(
    auth: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemons: Daemons
) -> None:
    registry = start_registry(tmp_path, auth)
    try:
        monkeypatch.setenv(
            "DOCKER_CONFIG", str(docker_config(tmp_path / "bad", registry.host, "alice", "nope"))
        )
        daemon = daemons.start()
        before = snapshot(daemon.store_root)
        response = pull(daemon, f"{registry.host}/team/tiny:v1")
        assert response.status_code == 401
        message = error_message(response)
        assert f"authentication failed for {registry.host}" in message and "docker login" in message
        result = daemon.cli("pull", f"{registry.host}/team/tiny:v1", check=False)
        assert result.returncode == 1 and "authentication failed" in result.stderr
        package(daemon, write_tiny_gguf(tmp_path / "tiny.gguf"), f"{registry.host}/team/tiny:v1")
        response = push(daemon, f"{registry.host}/team/tiny:v1")
        assert response.status_code == 401
        assert snapshot(daemon.store_root) != before  # the packaged model; the failed pull added nothing
    finally:
        registry.stop()


def test_no_credentials_for_a_private_repository(tmp_path: Path, daemons: Daemons) -> None:
    registry = start_registry(tmp_path, "htpasswd")
    try:
        response = pull(daemons.start(), f"{registry.host}/team/tiny:v1")
        assert response.status_code == 401
        assert "requires authentication" in error_message(response)
    finally:
        registry.stop()


def upload(
    registry: Registry, repository: str, tag: str, blobs: list[bytes], manifest: bytes, media_type: str
) -> None:
    """Put an artifact into the registry directly, as alice."""
    headers = registry.auth_for(f"repository:{repository}:pull,push")
    import hashlib

    for blob in blobs:
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        start = httpx.post(f"{registry.url}/v2/{repository}/blobs/uploads/", headers=headers)
        assert start.status_code == 202, start.text
        location = start.headers["location"]
        location += ("&" if "?" in location else "?") + f"digest={digest}"
        done = httpx.put(
            location, content=blob, headers={**headers, "Content-Type": "application/octet-stream"}
        )
        assert done.status_code == 201, done.text
    put = httpx.put(
        f"{registry.url}/v2/{repository}/manifests/{tag}",
        content=manifest,
        headers={**headers, "Content-Type": media_type},
    )
    assert put.status_code == 201, put.text


def tiny_artifact(daemon: Daemon, tmp_path: Path) -> tuple[list[bytes], bytes, str]:
    """The tiny model's blobs and manifest, as packaged by the daemon (then removed from its store)."""
    model_id = package(daemon, write_tiny_gguf(tmp_path / "tiny.gguf"), "scratch/tiny")
    manifest = (daemon.store_root / "manifests/sha256" / model_id[7:]).read_bytes()
    doc = json.loads(manifest)
    blobs = [
        (daemon.store_root / "blobs/sha256" / d["digest"][7:]).read_bytes()
        for d in [*doc["layers"], doc["config"]]
    ]
    daemon.cli("rm", "scratch/tiny")
    return blobs, manifest, model_id


def test_token_realm_on_a_foreign_host_gets_no_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemons: Daemons
) -> None:
    registry = start_registry(tmp_path, "token", token_host="localhost")  # realm: http://localhost:...
    monkeypatch.setenv(
        "DOCKER_CONFIG", str(docker_config(tmp_path / "docker", registry.host, "alice", "wonderland"))
    )
    daemon = daemons.start()
    try:
        blobs, manifest, model_id = tiny_artifact(daemon, tmp_path)
        upload(registry, "public/tiny", "v1", blobs, manifest, mt.OCI_MANIFEST)
        upload(registry, "private/tiny", "v1", blobs, manifest, mt.OCI_MANIFEST)
        assert registry.token_server is not None
        registry.token_server.requests.clear()

        assert last_event(pull(daemon, f"{registry.host}/public/tiny:v1"))["type"] == "success"
        denied = pull(daemon, f"{registry.host}/private/tiny:v1")
        assert denied.status_code == 401
        assert registry.token_server.requests
        assert not any(r.authorization for r in registry.token_server.requests)
        assert daemon.models()[0]["id"] == model_id
    finally:
        registry.stop()


@pytest.mark.parametrize("target", ["http://169.254.169.254", "http://10.1.2.3:5000", "http://192.168.0.1"])
def test_redirect_to_a_private_address_is_refused(
    target: str, plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    ref = f"{proxy.host}/team/tiny:v1"
    pushed_model(daemon, tmp_path, ref)
    before = snapshot(daemon.store_root)
    proxy.controls.redirect_blobs_to = target
    response = pull(daemon, ref)
    event = last_event(response)
    assert event["type"] == "error" and "refusing redirect" in event["message"]
    assert snapshot(daemon.store_root) == before


def test_redirect_is_followed_without_credentials(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    storage = proxy_for(plain_registry)  # stands in for blob storage (loopback, like the registry)
    try:
        ref = f"{proxy.host}/team/tiny:v1"
        model_id = pushed_model(daemon, tmp_path, ref)
        proxy.controls.redirect_blobs_to = f"http://{storage.host}"
        assert last_event(pull(daemon, ref, **{"bearer-token": "secret-token"}))["type"] == "success"
        assert any(h.get("Authorization") == "Bearer secret-token" for h in proxy.request_headers)
        assert storage.requests and not any("Authorization" in h for h in storage.request_headers)
        assert daemon.models()[0]["id"] == model_id
    finally:
        storage.stop()


def _manifest(layers: list[dict[str, Any]], config_type: str = mt.CONFIG_V01) -> bytes:
    config = {"mediaType": config_type, "digest": "sha256:" + "a" * 64, "size": 10}
    doc = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST, "config": config, "layers": layers}
    return json.dumps(doc).encode()


GOOD_LAYER = {"mediaType": mt.GGUF, "digest": "sha256:" + "b" * 64, "size": 100}
BAD_MANIFESTS = {
    "empty-layers": (_manifest([]), 400, "no layers"),
    "absurd-size": (_manifest([{**GOOD_LAYER, "size": 1 << 60}]), 400, "invalid size"),
    "negative-size": (_manifest([{**GOOD_LAYER, "size": -1}]), 400, "invalid size"),
    "unknown-layer-type-unsafe-path": (  # an unknown type is kept (as DMR), its path still checked
        _manifest(
            [
                {
                    **GOOD_LAYER,
                    "mediaType": "application/x-evil",
                    "annotations": {mt.ANNOTATION_FILEPATH: "../x"},
                }
            ]
        ),
        400,
        "unsafe file path",
    ),
    "dotdot-digest": (_manifest([{**GOOD_LAYER, "digest": "sha256:../../../etc/passwd"}]), 400, "digest"),
    "short-digest": (_manifest([{**GOOD_LAYER, "digest": "sha256:" + "b" * 63}]), 400, "digest"),
    "path-annotation": (
        _manifest([{**GOOD_LAYER, "annotations": {mt.ANNOTATION_FILEPATH: "../../x.gguf"}}]),
        400,
        "unsafe file path",
    ),
    "unknown-config": (
        _manifest([GOOD_LAYER], "application/vnd.example.config.v9+json"),
        422,
        "try upgrading",
    ),
    "not-json": (b"{not json", 400, "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_malformed_manifests_are_refused(
    case: str, plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon
) -> None:
    body, status, words = BAD_MANIFESTS[case]
    proxy.controls.manifests["/v2/evil/model/manifests/latest"] = (body, mt.OCI_MANIFEST)
    before = snapshot(daemon.store_root)
    response = pull(daemon, f"{proxy.host}/evil/model")
    assert response.status_code == status, response.text
    assert words in error_message(response)
    assert snapshot(daemon.store_root) == before
    assert proxy.ranges == []  # no blob was requested


def test_a_layer_of_an_unknown_type_is_pulled_and_kept(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    # DMR (oci.ParseManifest, internal/bundle/unpack.go) takes any layer type and ignores what it does not
    # know, e.g. the model-spec's gguf.v3.lora: pulled, stored, left out of the bundle.
    pushed_model(daemon, tmp_path, f"{proxy.host}/team/tiny:v1")
    response = httpx.get(
        f"{plain_registry.url}/v2/team/tiny/manifests/v1", headers={"Accept": mt.OCI_MANIFEST}, timeout=30
    )
    doc = response.json()
    lora = {**doc["config"], "mediaType": "application/vnd.docker.ai.gguf.v3.lora"}  # an existing blob
    doc["layers"].append(lora)
    proxy.controls.manifests["/v2/team/tiny/manifests/lora"] = (json.dumps(doc).encode(), mt.OCI_MANIFEST)
    assert last_event(pull(daemon, f"{proxy.host}/team/tiny:lora"))["type"] == "success"
    [model] = daemon.models()
    assert model["config"]["format"] == "gguf"
    assert daemon.http("GET", f"/models/{proxy.host}/team/tiny:lora").status_code == 200


def test_unknown_model_is_a_404(plain_registry: Registry, daemon: Daemon) -> None:
    response = pull(daemon, f"{plain_registry.host}/nobody/nothing:v1")
    assert response.status_code == 404
    assert "not found" in error_message(response)


def test_invalid_reference_is_a_400(daemon: Daemon) -> None:
    for bad in ("../etc/passwd", "a//b", "a/%2e%2e/b", "x@sha256:../../y", "/abs/path"):
        response = pull(daemon, bad)
        assert response.status_code == 400, bad


@pytest.mark.parametrize("body", [b"{not json", b"[]", b"[" * 100_000, b'{"bearer-token": 5}'])
def test_malformed_push_and_pull_bodies_are_400(daemon: Daemon, body: bytes) -> None:
    for path in ("/models/ai/tiny/push", "/models/create"):
        response = daemon.http("POST", path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400, (path, response.text)
        assert error_message(response)


# --- concurrency -------------------------------------------------------------------------------------------


def test_two_clients_pulling_one_model_share_one_download(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    ref = f"{proxy.host}/team/tiny:v1"
    model_id = pushed_model(daemon, tmp_path, ref)
    digest, size = tiny_layer(tmp_path)
    proxy.reset_counts()
    proxy.controls.hold_after = 100_000
    results: list[list[dict[str, Any]]] = []
    streams_open = threading.Barrier(3)

    def client() -> None:
        with (
            httpx.Client(timeout=120) as http,
            http.stream(
                "POST",
                daemon.url + "/models/create",
                json={"from": ref},
                headers={"Accept": "application/json"},
            ) as response,
        ):
            streams_open.wait(60)
            results.append([json.loads(line) for line in response.iter_lines() if line.strip()])

    first = threading.Thread(target=client)
    first.start()
    wait_for_partial(daemon, digest, 100_000)
    second = threading.Thread(target=client)
    second.start()
    streams_open.wait(60)  # both requests are attached to the job
    proxy.controls.hold_after = None
    proxy.controls.release.set()
    first.join(60)
    second.join(60)
    assert [r[-1]["type"] for r in results] == ["success", "success"]
    # One download: every byte crossed the proxy once (the held response ended early and was resumed).
    assert proxy.blob_bytes == size + proxy_config_bytes(daemon, model_id)


# --- push specifics ----------------------------------------------------------------------------------------


def test_push_skips_existing_blobs_and_mounts_across_repositories(
    plain_registry: Registry, proxy: RegistryProxy, daemon: Daemon, tmp_path: Path
) -> None:
    first = f"{proxy.host}/team/tiny:v1"
    package(daemon, write_tiny_gguf(tmp_path / "tiny.gguf"), first)
    assert last_event(push(daemon, first))["type"] == "success"
    patches = [r for r in proxy.requests if r[0] == "PATCH"]
    assert patches

    proxy.requests.clear()
    events = json_lines(push(daemon, first).text)
    assert events[-1]["type"] == "success" and all(e["mode"] == "push" for e in events)
    assert not [r for r in proxy.requests if r[0] in ("PATCH", "POST")]

    second = f"{proxy.host}/other/tiny:v2"
    daemon.cli("tag", first, second)
    proxy.requests.clear()
    assert last_event(push(daemon, second))["type"] == "success"
    mounts = [r for r in proxy.requests if r[0] == "POST" and "mount=" in r[1]]
    assert mounts and "from=team/tiny" in mounts[0][1]
    assert not [r for r in proxy.requests if r[0] == "PATCH"]


def test_push_of_a_missing_model_is_a_404(plain_registry: Registry, daemon: Daemon) -> None:
    response = push(daemon, f"{plain_registry.host}/team/none:v1")
    assert response.status_code == 404


def test_default_registry_and_mirror(
    plain_registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemons: Daemons
) -> None:
    """DEFAULT_REGISTRY names the registry of bare names; a mirror serves pulls when configured."""
    seeder = daemons.start(tmp_path / "seed")
    pushed_model(seeder, tmp_path, f"{plain_registry.host}/ai/tiny:latest")
    seeder.stop()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("DEFAULT_REGISTRY", dead)
    monkeypatch.setenv("MODEL_RUNNER_REGISTRY_MIRRORS", f"{dead}=http://{plain_registry.host}")
    daemon = daemons.start()
    assert last_event(pull(daemon, "tiny"))["type"] == "success"
    assert daemon.models()[0]["tags"] == [f"{dead}/ai/tiny:latest"]
