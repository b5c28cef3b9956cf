"""The CPU container image, built and run here with buildah (chroot isolation; no Docker daemon, no registry):
deploy/image/build makes it (the Debian base from debootstrap, cached), then the daemon starts inside it as
its non-root user, `/engines/status` shows the built-in llama.cpp, and a chat with the tiny GGUF answers.

Slow (the first build compiles llama.cpp for the image: 10-30 minutes here), so not in the default suite:
`scripts/test` runs it when the image's inputs change (MODELRUNNER_IMAGE_TEST=1, see tests/image/conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.daemon import free_port
from tests.models import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 3 * 3600


@pytest.fixture(scope="module")
def image() -> str:
    done = subprocess.run(
        [str(ROOT / "deploy" / "image" / "build"), "cpu"],
        stdout=subprocess.PIPE,
        stderr=None,  # buildah's progress goes to the test's output
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert done.returncode == 0, "deploy/image/build failed (its output is above)"
    return done.stdout.strip().splitlines()[-1]


def buildah(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def container(image: str) -> Iterator[str]:
    made = buildah("from", "--quiet", image)
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip()
    try:
        yield name
    finally:
        buildah("rm", name)


def run_in(container: str, *command: str, volume: str | None = None) -> list[str]:
    argv = ["buildah", "run", "--isolation", "chroot", "--network", "host"]
    argv += ["-v", volume] if volume else []
    return [*argv, container, "--", *command]


def test_the_image_has_the_c_relay(container: str) -> None:
    done = subprocess.run(
        run_in(container, "/opt/modelrunner/bin/python", "-c", "import modelrunner._relay"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr  # built at install (python3-dev in the build stage)


def test_the_image_refuses_to_listen_beyond_loopback_without_a_key(container: str) -> None:
    done = subprocess.run(
        run_in(container, "model", "serve", "--host", "0.0.0.0"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "without an API key" in done.stderr


def test_the_daemon_runs_in_the_image_and_answers_a_chat(container: str, tmp_path: Path) -> None:
    config = buildah("inspect", "--format", "{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}", container)
    assert config.stdout.split()[0] == "10001:10001" and "model" in config.stdout  # non-root, `model` first
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_gguf(models / "tiny.gguf")
    models.chmod(0o755)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            # the model file is read by the daemon (`model package` sends its path): mounted read-only
            run_in(container, "model", "serve", "--port", str(port), volume=f"{models}:/models:ro"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status = httpx.get(url + "/engines/status", timeout=2)
                break
            except httpx.TransportError:
                assert daemon.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        assert status.status_code == 200
        assert status.json()["llama.cpp"] == "Running: llama.cpp b11434"  # built into the image
        packaged = subprocess.run(
            run_in(
                container,
                "env",
                f"MODEL_RUNNER_HOST={url}",
                "model",
                "package",
                "--gguf",
                "/models/tiny.gguf",
                "ai/tiny",
            ),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert packaged.returncode == 0, packaged.stderr
        body = {"model": "ai/tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answer = httpx.post(url + "/engines/v1/chat/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] > 0
        [runner] = httpx.get(url + "/engines/ps", timeout=10).json()
        engine_pid = runner["pid"]
        assert Path(f"/proc/{engine_pid}/cmdline").read_bytes().startswith(b"/opt/llama.cpp/bin/llama-server")
    finally:
        # chroot isolation has no PID namespace of its own: stop the daemon itself, as a container runtime
        # would (buildah does not pass signals on), and it stops its engines
        for pid in serving(port):
            os.kill(pid, signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    assert not serving(port), "the daemon is still running"
    assert not os.path.exists(f"/proc/{engine_pid}"), "the engine outlived the daemon"


def serving(port: int) -> list[int]:
    """The daemon processes started in the container for this port (their command line names it)."""
    wanted = f"serve\0--port\0{port}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in found if b"buildah" not in (Path(f"/proc/{pid}/cmdline").read_bytes()[:64])]
