"""Image generation for real: a `model serve` process, the diffusers engine installed from the cached
environment, and a tiny random-weight Stable Diffusion pipeline packaged as DDUF (tests/diffusers_env.py).

Images are 64x64 with 2 steps (~0.3 s each on CPU); the random weights make noise, so the tests check
PNG structure, sizes, counts and byte equality, never content.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.engines import diffusers
from tests.daemon import Daemon, engine_log, error_message, free_port, snapshot
from tests.models import write_dduf_with_compressed_entry, write_dduf_with_entry_name

ROUTE = "/engines/diffusers/v1/images/generations"
SMALL = {"size": "64x64", "num_inference_steps": 2}


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature and the chunk's place."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    assert data[-8:-4] == b"IEND"
    return width, height


def images(response: httpx.Response) -> list[bytes]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"created", "data"}
    return [base64.b64decode(item["b64_json"], validate=True) for item in body["data"]]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_sd_dduf: Path) -> Iterator[Daemon]:
    running = Daemon(tmp_path_factory.mktemp("diffusers") / "home", free_port()).start()
    out = running.cli("install-runner", "--backend", "diffusers", "--gpu", "none").stdout
    assert "Using the cached diffusers environment" in out, out
    assert f"(Running: diffusers {diffusers.VERSION})" in out
    running.cli("package", "--dduf", str(tiny_sd_dduf), "tiny-sd")
    yield running
    running.stop()


def generate(daemon: Daemon, path: str = ROUTE, **fields: Any) -> httpx.Response:
    body = {"model": "tiny-sd", "prompt": "A picture of a nice cat", **SMALL, **fields}
    return daemon.http("POST", path, json=body, timeout=120)


def test_the_issue_curl_flow_gives_a_png_of_the_asked_size(daemon: Daemon) -> None:
    [png] = images(generate(daemon))
    assert png_size(png) == (64, 64)
    [wide] = images(generate(daemon, size="96x64"))
    assert png_size(wide) == (96, 64)
    [runner] = daemon.http("GET", "/engines/ps").json()
    assert runner["backend_name"] == "diffusers" and runner["mode"] == "image-generation"
    size = os.path.getsize(next((daemon.store_root / "bundles").rglob("*.dduf")))
    assert runner["memory_estimate"] == diffusers.MEMORY_OVERHEAD + int(diffusers.WEIGHTS_FACTOR * size)


def test_same_seed_same_bytes_on_every_route_and_image_i_uses_seed_plus_i(daemon: Daemon) -> None:
    [first] = images(generate(daemon, seed=42))
    for path in ("/engines/v1/images/generations", "/v1/images/generations"):
        assert images(generate(daemon, path, seed=42)) == [first]
    pair = images(generate(daemon, seed=42, n=2))
    assert len(pair) == 2 and pair[0] == first and pair[1] != first
    assert images(generate(daemon, seed=43)) == [pair[1]]
    assert all(png_size(png) == (64, 64) for png in pair)
    assert len(daemon.http("GET", "/engines/ps").json()) == 1  # one runner served all three prefixes


def test_the_model_may_be_named_as_dmr_normalises_it(daemon: Daemon) -> None:
    for name in ("ai/tiny-sd:latest", "docker.io/ai/tiny-sd"):
        assert len(images(generate(daemon, model=name))) == 1


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"size": "65x64"}, "multiple of 8"),
        ({"size": "8x8"}, "multiple of 8"),
        ({"size": "huge"}, "512x512"),
        ({"n": 11}, "n must be from 1 to 10"),
        ({"num_inference_steps": 0}, "from 1 to 150"),
        ({"response_format": "url"}, "b64_json"),
    ],
)
def test_bad_values_are_400(daemon: Daemon, fields: dict[str, Any], problem: str) -> None:
    response = generate(daemon, **fields)
    assert response.status_code == 400
    assert problem in error_message(response)


def test_unknown_model_is_404(daemon: Daemon) -> None:
    response = generate(daemon, model="no-such-model")
    assert response.status_code == 404
    assert "no-such-model" in error_message(response)


def test_chat_with_an_image_model_is_400(daemon: Daemon) -> None:
    body = {"model": "tiny-sd", "messages": [{"role": "user", "content": "hi"}]}
    response = daemon.http("POST", "/engines/llama.cpp/v1/chat/completions", json=body)
    assert response.status_code == 400  # a DDUF model goes to diffusers whatever the URL says
    assert "/v1/images/generations" in error_message(response)


def test_cli_run_writes_the_png_and_prints_its_path(daemon: Daemon, tmp_path: Path) -> None:
    out = tmp_path / "cat.png"
    args = ("run", "tiny-sd", "a nice cat", "-o", str(out), "--size", "64x64", "--steps", "2", "--seed", "7")
    ran = daemon.cli(*args)
    assert ran.stdout.strip() == str(out)  # only the path: stderr says what happens (issue 37 item 10)
    said = ran.stderr.splitlines()
    assert said[0] == "Generating an image (64x64, 2 steps, seed 7) with tiny-sd..."
    assert [line for line in said if line.startswith("Step ")] == ["Step 1/2", "Step 2/2"]  # the engine's log
    assert said[-1].startswith(f"Wrote {out} in ") and said[-1].endswith("s")
    assert png_size(out.read_bytes()) == (64, 64)
    [same] = images(generate(daemon, prompt="a nice cat", seed=7))
    assert out.read_bytes() == same
    bad = daemon.cli("run", "tiny-sd", "a cat", "-o", str(tmp_path / "x.png"), "--size", "7x7", check=False)
    assert bad.returncode != 0 and "multiple of 8" in bad.stderr
    assert not (tmp_path / "x.png").exists()
    daemon.http("POST", "/engines/unload", json={"all": True})
    assert daemon.cli("run", "-d", "tiny-sd").stdout == ""  # -d only loads the image model
    [runner] = daemon.http("GET", "/engines/ps").json()
    assert runner["mode"] == "image-generation"


def test_hostile_ddufs_are_refused_at_package_time(daemon: Daemon, tmp_path: Path) -> None:
    before = snapshot(daemon.store_root)
    for name, writer in (
        ("compressed", write_dduf_with_compressed_entry),
        ("escaping", lambda p: write_dduf_with_entry_name(p, "../x")),
    ):
        bad = writer(tmp_path / f"{name}.dduf")
        result = daemon.cli("package", "--dduf", str(bad), name, check=False)
        assert result.returncode != 0
        assert ("compressed" if name == "compressed" else "not a clean relative path") in result.stderr
    assert snapshot(daemon.store_root) == before


def _swap_bundle_dduf(daemon: Daemon, tag: str, hostile: Path) -> Path:
    """Bypass the builder: replace a packaged model's bundle file (a hard link to the blob) by hand."""
    model_id: str = daemon.http("GET", f"/models/{tag}").json()["id"]
    bundle = daemon.store_root / "bundles" / "sha256" / model_id.removeprefix("sha256:")
    if not bundle.is_dir():  # the bundle is built on first use; a chat request is refused after building it
        daemon.http(
            "POST",
            "/v1/chat/completions",
            json={"model": tag, "messages": [{"role": "user", "content": "hi"}]},
        )
    [target] = list((bundle / "model").glob("*.dduf"))
    target.unlink()  # break the link: the blob keeps the good bytes
    target.write_bytes(hostile.read_bytes())
    return bundle


@pytest.mark.parametrize("kind", ["compressed", "escaping"])
def test_hostile_ddufs_are_refused_at_load_time(
    daemon: Daemon, tmp_path: Path, tiny_sd_dduf: Path, kind: str
) -> None:
    tag = f"victim-{kind}"
    daemon.cli("package", "--dduf", str(tiny_sd_dduf), tag)
    if kind == "compressed":
        hostile = write_dduf_with_compressed_entry(tmp_path / "bad.dduf")
    else:
        hostile = write_dduf_with_entry_name(tmp_path / "bad.dduf", "../x")
    bundle = _swap_bundle_dduf(daemon, tag, hostile)
    response = generate(daemon, model=tag)
    assert response.status_code == 500
    message = error_message(response)
    assert "DIFFUSERS_ERROR: invalid DDUF file" in message
    assert ("is compressed" if kind == "compressed" else "not a clean relative path") in message
    assert str(daemon.home) not in message
    unpacked = bundle / "dduf-unpacked"
    assert not unpacked.exists() or not any(unpacked.rglob("*"))  # nothing was written
    assert not (bundle / "x").exists() and not (bundle / "dduf-unpacked" / ".." / "x").exists()


def test_the_server_alone_refuses_a_hostile_dduf(diffusers_python: Path, tmp_path: Path) -> None:
    """The load-time check without the daemon: the server exits 1 with DMR's error marker."""
    bundle = tmp_path / "bundle"
    (bundle / "model").mkdir(parents=True)
    dduf = write_dduf_with_entry_name(bundle / "model" / "bad.dduf", "../x")
    src = Path(diffusers.__file__).parents[2]  # the package's source root, as a PYTHONPATH entry
    argv = [str(diffusers_python), "-m", diffusers.SERVER_PACKAGE, "--model-path", str(dduf)]
    argv += ["--uds", str(tmp_path / "s.sock"), "--served-model-name", "bad"]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(src)}
    )
    assert result.returncode == 1
    assert "DIFFUSERS_ERROR: invalid DDUF file bad.dduf: entry '../x'" in result.stderr
    assert not (bundle / "x").exists() and not (bundle / "model" / "x").exists()


def test_engine_not_installed_is_412(tmp_path: Path, tiny_sd_dduf: Path) -> None:
    bare = Daemon(tmp_path / "bare-home", free_port()).start()
    try:
        bare.cli("package", "--dduf", str(tiny_sd_dduf), "tiny-sd")
        response = generate(bare)
        assert response.status_code == 412
        assert "install-runner --backend diffusers" in error_message(response)
        status = bare.http("GET", "/engines/status").json()
        assert status["diffusers"] == "Not Installed: no diffusers environment installed"
    finally:
        bare.stop()


def test_the_first_run_installs_the_engine_from_the_cache(
    tmp_path: Path, tiny_sd_dduf: Path, diffusers_python: Path
) -> None:
    """Issue 37 item 4, for real: on a fresh runner home `model run` installs diffusers (the cached
    environment: seconds), says so on stderr, then writes the picture (tests/conformance/test_cli_first_use.py
    names DMR's ensureStandaloneRunnerAvailable)."""
    bare = Daemon(tmp_path / "fresh-home", free_port()).start()
    try:
        bare.cli("package", "--dduf", str(tiny_sd_dduf), "tiny-sd")
        out = tmp_path / "first.png"
        ran = bare.cli("run", "tiny-sd", "a cat", "-o", str(out), "--size", "64x64", "--steps", "2")
        assert ran.stdout.strip() == str(out) and png_size(out.read_bytes()) == (64, 64)
        assert "diffusers is not installed yet: installing it now" in ran.stderr
        assert "Using the cached diffusers environment" in ran.stderr
        assert bare.http("GET", "/engines/status").json()["diffusers"].startswith("Running: diffusers")
    finally:
        bare.stop()


def test_install_status_reinstall_uninstall(tmp_path: Path, diffusers_python: Path) -> None:
    home = Daemon(tmp_path / "home", free_port()).start()
    try:
        out = home.cli("install-runner", "--backend", "diffusers", "--gpu", "none").stdout
        assert f"Installed diffusers {diffusers.VERSION} (cpu)" in out
        assert "already installed" in home.cli("install-runner", "--backend", "diffusers").stdout
        assert "Using the cached" in home.cli("reinstall-runner", "--backend", "diffusers").stdout
        lines = home.cli("status").stdout.splitlines()  # DMR's table: BACKEND STATUS DETAILS
        assert f"diffusers  Running        diffusers {diffusers.VERSION}" in [line.rstrip() for line in lines]
        status = json.loads(home.cli("status", "--json").stdout)
        assert status["backends"]["diffusers"] == f"Running: diffusers {diffusers.VERSION}"
        removed = home.cli("uninstall-runner", "--backend", "diffusers").stdout
        assert removed.strip() == "Uninstalled diffusers"
        assert not (home.home / "engines" / "diffusers").exists()
        assert diffusers_python.exists()  # the machine's cached environment stays
        bad = home.cli("install-runner", "--backend", "diffusers", "--gpu", "vulkan", check=False)
        assert bad.returncode != 0 and "no Vulkan build" in bad.stderr
    finally:
        home.stop()


def test_a_client_that_leaves_stops_the_generation(daemon: Daemon) -> None:
    """The daemon closes the engine connection of a client that left; our diffusers server then stops at
    the next denoising step (10 images of 150 steps would take minutes) and the runner is free."""
    body = json.dumps(
        {"model": "tiny-sd", "prompt": "a cat", "size": "64x64", "num_inference_steps": 150, "n": 10}
    )
    data = body.encode()
    started, stopped = "image generation started", "image generation stopped: the client left"
    log = engine_log(daemon.home, "diffusers")
    before = log.count(started), log.count(stopped)
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=120) as sock:
        sock.sendall(
            f"POST {ROUTE} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
            + b"Content-Length: %d\r\n\r\n" % len(data)
            + data
        )
        deadline = time.monotonic() + 120
        while engine_log(daemon.home, "diffusers").count(started) <= before[0]:  # the engine is at work
            assert time.monotonic() < deadline, "the generation did not start"
            time.sleep(0.05)
    deadline = time.monotonic() + 120
    while engine_log(daemon.home, "diffusers").count(stopped) <= before[1]:
        assert time.monotonic() < deadline, "the engine did not stop generating"
        time.sleep(0.1)
    deadline = time.monotonic() + 60
    while any(r["in_use"] for r in daemon.http("GET", "/engines/ps").json()):  # released as the answer ended
        assert time.monotonic() < deadline, "the runner stayed in use"
        time.sleep(0.05)
    [png] = images(generate(daemon))  # the pipeline is free for the next request
    assert png_size(png) == (64, 64)
