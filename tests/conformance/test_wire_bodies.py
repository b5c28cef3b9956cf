"""Request bodies are read whatever their Content-Type, as DMR reads them, and browsers still cannot post
them cross-origin.

Follows: DMR's handlers decode bodies with json.Unmarshal on the raw bytes (`pkg/inference/scheduling/
http_handler.go`, `pkg/inference/models/http_handler.go`); its README's `curl ... -d '{"from": "ai/smollm2"}'`
and its Helm chart's pre-pull init container (`charts/docker-model-runner/templates/deployment.yaml`:
`curl -d "{\\"from\\": \\"$model\\"}" "$MODEL_RUNNER"/models/create`) send
`application/x-www-form-urlencoded`; its CLI sends `Content-Type: application/json`
(`cmd/cli/desktop/desktop.go: doRequestWithAuthContext`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conformance.dmr_daemons import package
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf
from tests.registry import Registry

FORM = {"content-type": "application/x-www-form-urlencoded"}  # what `curl -d` sends


def post(
    daemon: InProcessDaemon, path: str, body: dict[str, object], headers: dict[str, str]
) -> httpx.Response:
    return daemon.http("POST", path, content=json.dumps(body).encode(), headers=headers)


@pytest.mark.parametrize(
    "headers",
    [FORM, {"content-type": "text/plain"}, {}],
    ids=["form-encoded", "text-plain", "no-content-type"],
)
def test_dmr_routes_read_any_body_as_json(
    fake_daemon: InProcessDaemon, tmp_path: Path, headers: dict[str, str]
) -> None:
    daemon = fake_daemon
    configure = post(daemon, "/engines/_configure", {"model": "tiny", "context-size": 512}, headers)
    assert configure.status_code == 202, configure.text
    [entry] = daemon.http("GET", "/engines/_configure").json()
    assert entry["Config"] == {"context-size": 512}

    repackaged = post(
        daemon, "/models/tiny/repackage", {"target": "tiny:small", "context_size": 256}, headers
    )
    assert repackaged.status_code == 201, repackaged.text
    assert daemon.http("GET", "/models/tiny:small").json()["config"]["context_size"] == 256

    gguf = write_tiny_gguf(tmp_path / "other.gguf", seed=3)
    packaged = post(daemon, "/models/package", {"target": "other", "gguf": str(gguf)}, headers)
    assert packaged.status_code == 201, packaged.text

    unloaded = post(daemon, "/engines/unload", {"all": True, "backend": "", "models": None}, headers)
    assert unloaded.status_code == 200 and set(unloaded.json()) == {"unloaded_runners"}

    # install/uninstall: the body is read, so the answer is about the backend it names
    installed = post(daemon, "/engines/install-backend", {"backend": "nope"}, headers)
    assert installed.status_code == 404 and "unknown backend 'nope'" in installed.text
    uninstalled = post(daemon, "/engines/uninstall-backend", {"backend": "nope"}, headers)
    assert uninstalled.status_code == 404


def test_a_body_that_is_not_json_is_still_a_400(fake_daemon: InProcessDaemon) -> None:
    for path in ("/engines/_configure", "/engines/unload", "/models/create", "/models/tiny/repackage"):
        response = fake_daemon.http("POST", path, content=b"from=ai/smollm2", headers=FORM)
        assert response.status_code == 400, (path, response.text)
        assert response.text == "the request body is not valid JSON\n"  # http.Error's
    assert fake_daemon.http("GET", "/engines/_configure").json() == []


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://localhost.evil.example"])
def test_cross_origin_simple_requests_are_still_refused(fake_daemon: InProcessDaemon, origin: str) -> None:
    """A web page can post text/plain or form bodies cross-origin without a preflight; the Origin header it
    must carry is refused before any route runs, so nothing changes."""
    daemon = fake_daemon
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        headers = {"content-type": content_type, "origin": origin}
        configure = post(daemon, "/engines/_configure", {"model": "tiny", "context-size": 64}, headers)
        assert configure.status_code == 403 and "origin is not allowed" in configure.text
        deleted = daemon.http("DELETE", "/models/tiny", headers={"origin": origin})
        assert deleted.status_code == 403
        purge = daemon.http("DELETE", "/models/purge", headers={"origin": origin})
        assert purge.status_code == 403
        pulled = post(daemon, "/models/create", {"from": "ai/smollm2"}, headers)
        assert pulled.status_code == 403
    assert daemon.http("GET", "/engines/_configure").json() == []
    assert [m["tags"] for m in daemon.http("GET", "/models").json()] == [["docker.io/ai/tiny:latest"]]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    running = Registry(tmp_path / "registry").start()
    yield running
    running.stop()


def test_the_helm_charts_pre_pull_command_pulls(
    fake_daemon: InProcessDaemon, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The init container's shell loop, run as it is written in the chart, with curl."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    daemon = fake_daemon
    package(daemon, tmp_path, f"{registry.host}/charts/prepull:v1", seed=11)
    pushed = daemon.http("POST", f"/models/{registry.host}/charts/prepull:v1/push", headers=FORM)
    assert pushed.status_code == 200 and '"success"' in pushed.text.replace("&#34;", '"')
    daemon.http("DELETE", f"/models/{registry.host}/charts/prepull:v1").raise_for_status()

    models = tmp_path / "models.txt"
    models.write_text(f"{registry.host}/charts/prepull:v1\n")
    script = (
        'while IFS= read -r model; do if [ -n "$model" ]; then echo "Pulling model: $model"; '
        'curl -sS -d "{\\"from\\": \\"$model\\"}" "$MODEL_RUNNER"/models/create; fi; done < "$MODELS"'
    )
    env = {**os.environ, "MODEL_RUNNER": daemon.url, "MODELS": str(models)}
    result = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Model pulled successfully" in result.stdout
    tags = [tag for m in daemon.http("GET", "/models").json() for tag in m["tags"]]
    assert f"{registry.host}/charts/prepull:v1" in tags


def test_the_readme_curl_examples(fake_daemon: InProcessDaemon) -> None:
    """DMR's README "Using the API" commands against our daemon: list, get, chat, delete, metrics."""
    daemon = fake_daemon

    def curl(*args: str) -> str:
        result = subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert [m["tags"] for m in json.loads(curl(f"{daemon.url}/models"))] == [["docker.io/ai/tiny:latest"]]
    assert json.loads(curl(f"{daemon.url}/models/ai/tiny"))["tags"] == ["docker.io/ai/tiny:latest"]
    chat = {"model": "ai/tiny", "messages": [{"role": "user", "content": "Hello, how are you?"}]}
    answer = json.loads(
        curl(f"{daemon.url}/engines/llama.cpp/v1/chat/completions", "-X", "POST", "-d", json.dumps(chat))
    )
    # an unstreamed chat on llama.cpp is asked of the engine as a stream and assembled (server/lifecycle.py):
    # the fake engine's streamed tokens
    assert answer["choices"][0]["message"]["content"] == "t0 t1 t2 "
    assert "modelrunner_loaded_runners 1" in curl(f"{daemon.url}/metrics")
    assert daemon.http("POST", "/engines/unload", json={"all": True}).json() == {"unloaded_runners": 1}
    assert json.loads(curl(f"{daemon.url}/models/ai/tiny", "-X", "DELETE"))[-1]["Deleted"].startswith(
        "sha256:"
    )
    assert json.loads(curl(f"{daemon.url}/models")) == []
