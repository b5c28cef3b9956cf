"""`ollama create` through the official client: uploads to /api/blobs, then /api/create from the uploaded
files or from a model, against a real daemon (and a real llama-server to chat with the result)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest

from modelrunner.artifact import mediatypes as mt
from tests.daemon import Daemon, snapshot
from tests.engines import tiny_daemon
from tests.models import write_tiny_gguf


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path_factory.mktemp("ollama-create"), llama_server) as running:
        yield running


@pytest.fixture
def client(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url)


def stored_manifest(daemon: Daemon, model_id: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((daemon.store_root / "manifests/sha256" / model_id[7:]).read_bytes())
    return result


def test_create_from_an_uploaded_gguf_with_a_license_and_a_context_size(
    daemon: Daemon, client: ollama.Client, tmp_path: Path
) -> None:
    gguf = write_tiny_gguf(tmp_path / "mine.gguf", seed=5)
    digest = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert daemon.http("HEAD", f"/api/blobs/{digest}").status_code == 404
    assert client.create_blob(gguf) == digest
    assert daemon.http("HEAD", f"/api/blobs/{digest}").status_code == 200

    progress = list(
        client.create(
            model="mine:v1",
            files={"mine.gguf": digest},
            license="Do what you like.",
            parameters={"num_ctx": 1024},
            stream=True,
        )
    )
    assert progress[-1].status == "success"
    model = daemon.http("GET", "/models/mine:v1").json()
    assert model["config"]["context_size"] == 1024 and model["config"]["format"] == "gguf"
    stored = Path(daemon.store_root / "blobs" / "sha256" / digest[7:])
    assert stored.read_bytes() == gguf.read_bytes()  # the upload became the model's GGUF blob
    assert not list((daemon.store_root / "downloads").glob("ollama-*"))  # moved, not left behind
    layers = stored_manifest(daemon, model["id"])["layers"]
    assert [layer["mediaType"] for layer in layers] == [mt.GGUF, mt.LICENSE]
    answer = client.chat(
        model="mine:v1",
        messages=[{"role": "user", "content": "hi"}],
        options={"num_predict": 3, "ignore_eos": True},
    )
    assert answer.done and answer.eval_count == 3


def test_create_from_a_model_sets_the_context_size(daemon: Daemon, client: ollama.Client) -> None:
    assert client.create(model="tiny-ctx", from_="tiny", parameters={"num_ctx": 256}).status == "success"
    assert daemon.http("GET", "/models/tiny-ctx").json()["config"]["context_size"] == 256
    tiny = daemon.http("GET", "/models/tiny").json()
    assert tiny["config"].get("context_size") != 256  # the source is unchanged


@pytest.mark.parametrize(
    ("request_body", "fragment", "status"),
    [
        ({"model": "x", "from": "tiny", "template": "{{ .Prompt }}"}, "template", 400),
        ({"model": "x", "from": "tiny", "quantize": "q4_K_M"}, "quantiz", 400),
        ({"model": "x", "from": "tiny", "adapters": {"a.gguf": "sha256:" + "a" * 64}}, "adapters", 400),
        ({"model": "x", "from": "tiny", "parameters": {"num_gpu": 1}}, "num_gpu", 400),
        ({"model": "x", "from": "tiny", "parameters": {"num_predict": "many"}}, "num_predict", 400),
        ({"model": "x", "from": "tiny", "messages": [{"role": "user", "content": "hi"}]}, "messages", 400),
        ({"model": "x", "from": "tiny", "parameters": {"num_ctx": 0}}, "num_ctx", 400),
        ({"model": "x", "modelfile": "FROM tiny"}, "Modelfile", 400),
        ({"model": "x"}, "either", 400),
        ({"model": "x", "from": "tiny", "files": {"m.gguf": "sha256:" + "a" * 64}}, "either", 400),
        ({"model": "x", "files": {"m.gguf": "sha256:" + "b" * 64}}, "no uploaded file", 400),
        ({"model": "x", "files": {"../m.gguf": "sha256:" + "b" * 64}}, "file name", 400),
        ({"model": "x", "files": {"m.gguf": "sha256:../../etc"}}, "digest", 400),
        ({"model": "x", "files": {"README.md": "sha256:" + "b" * 64}}, "", 400),
        ({"model": "../x", "from": "tiny"}, "", 400),
        ({"model": "x", "from": "absent"}, "not found", 404),
    ],
)
def test_bad_create_requests_change_nothing(
    daemon: Daemon, request_body: dict[str, Any], fragment: str, status: int
) -> None:
    before = snapshot(daemon.store_root)
    response = daemon.http("POST", "/api/create", json=request_body)
    assert response.status_code == status, response.text
    assert fragment.lower() in response.json()["error"].lower()
    assert snapshot(daemon.store_root) == before


def test_an_upload_that_does_not_match_its_digest_is_refused(daemon: Daemon) -> None:
    before = snapshot(daemon.store_root)
    digest = "sha256:" + hashlib.sha256(b"expected").hexdigest()
    response = daemon.http("POST", f"/api/blobs/{digest}", content=b"something else")
    assert response.status_code == 400 and "digest" in response.json()["error"]
    assert daemon.http("HEAD", f"/api/blobs/{digest}").status_code == 404
    assert snapshot(daemon.store_root) == before
    assert daemon.http("POST", "/api/blobs/sha256:nothex", content=b"x").status_code == 400
