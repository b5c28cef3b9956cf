"""`model pull hf.co/...` against a local test double of the Hugging Face Hub (HF_ENDPOINT)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.artifact import mediatypes as mt
from tests.daemon import Daemon, Daemons, error_message, json_lines, snapshot
from tests.hf_hub import FakeHub, HubRepo
from tests.models import CHAT_TEMPLATE, write_tiny_gguf, write_tiny_gguf_shards, write_tiny_safetensors_dir


def gguf_bytes(tmp_path: Path, seed: int) -> bytes:
    return write_tiny_gguf(tmp_path / f"seed{seed}.gguf", seed=seed, chat_template=False).read_bytes()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    shards_dir = tmp_path / "shards"
    shards_dir.mkdir()
    shards = write_tiny_gguf_shards(shards_dir, 2, stem="Big-Q4_K_M")
    safetensors = write_tiny_safetensors_dir(tmp_path / "st")
    tokenizer_config = json.dumps({"chat_template": CHAT_TEMPLATE}).encode()
    repos = {
        "TestOrg/Tiny-GGUF": HubRepo(
            {
                "Tiny-Q4_K_M.gguf": gguf_bytes(tmp_path, 1),
                "Tiny-Q8_0.gguf": gguf_bytes(tmp_path, 2),
                "mmproj-Tiny-f32.gguf": b"projector-f32",
                "mmproj-Tiny-f16.gguf": b"projector-f16",
                "tokenizer_config.json": tokenizer_config,
                "README.md": b"# tiny\n",
            }
        ),
        "TestOrg/Sharded-GGUF": HubRepo(
            {
                **{f"Q4_K_M/{s.name}": s.read_bytes() for s in shards},
                "Q8_0/Big-Q8_0.gguf": gguf_bytes(tmp_path, 3),
            }
        ),
        "TestOrg/Tiny-Safetensors": HubRepo(
            {
                p.relative_to(safetensors).as_posix(): p.read_bytes()
                for p in safetensors.rglob("*")
                if p.is_file() and not p.name.startswith(".")
            }
            | {"pytorch_model.bin": b"not for us"}
        ),
        "TestOrg/Private-GGUF": HubRepo({"Private-Q4_K_M.gguf": gguf_bytes(tmp_path, 4)}, token="hf_secret"),
    }
    running = FakeHub(repos).start()
    yield running
    running.stop()


@pytest.fixture
def daemon(hub: FakeHub, daemons: Daemons, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return daemons.start()


def pull(daemon: Daemon, ref: str, **body: Any) -> httpx.Response:
    return daemon.http(
        "POST",
        "/models/create",
        json={"from": ref, **body},
        headers={"Accept": "application/json"},
        timeout=120,
    )


def manifest_of(daemon: Daemon, model_id: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((daemon.store_root / "manifests/sha256" / model_id[7:]).read_bytes())
    return result


def test_gguf_default_quantization_with_projector_and_template(daemon: Daemon, hub: FakeHub) -> None:
    response = pull(daemon, "hf.co/TestOrg/Tiny-GGUF")
    assert response.status_code == 200, response.text
    events = json_lines(response.text)
    messages = [e["message"] for e in events]
    assert "Fetching file list..." in messages
    assert "Selected Q4_K_M quantization (default)" in messages
    assert any(m.startswith("Found 3 files") for m in messages)
    assert "Building model artifact..." in messages
    assert events[-1]["type"] == "success"
    assert sorted(hub.downloads) == ["Tiny-Q4_K_M.gguf", "mmproj-Tiny-f16.gguf", "tokenizer_config.json"]

    [model] = daemon.models()
    assert model["tags"] == ["huggingface.co/testorg/tiny-gguf:latest"]
    manifest = manifest_of(daemon, model["id"])
    assert manifest["config"]["mediaType"] == mt.CONFIG_V01
    layers = {
        layer["mediaType"]: layer["annotations"][mt.ANNOTATION_FILEPATH] for layer in manifest["layers"]
    }
    assert layers == {
        mt.GGUF: "Tiny-Q4_K_M.gguf",
        mt.MMPROJ: "mmproj-Tiny-f16.gguf",
        mt.CHAT_TEMPLATE: "template.jinja",
    }
    assert model["created"] == 1740830400  # the repository's lastModified

    # Deterministic: the same repository gives the same model ID again.
    daemon.cli("rm", "hf.co/TestOrg/Tiny-GGUF")
    assert json_lines(pull(daemon, "hf.co/TestOrg/Tiny-GGUF").text)[-1]["type"] == "success"
    assert daemon.models()[0]["id"] == model["id"]
    cached = json_lines(pull(daemon, "hf.co/TestOrg/Tiny-GGUF").text)
    assert cached[-1]["message"].startswith("Using cached model")


def test_explicit_quantization(daemon: Daemon, hub: FakeHub) -> None:
    events = json_lines(pull(daemon, "hf.co/TestOrg/Tiny-GGUF:Q8_0").text)
    assert "Selected Q8_0 quantization" in [e["message"] for e in events]
    assert "Tiny-Q8_0.gguf" in hub.downloads and "Tiny-Q4_K_M.gguf" not in hub.downloads
    # the tag keeps its case, as DMR stores it (distribution/normalize_test.go)
    assert daemon.models()[0]["tags"] == ["huggingface.co/testorg/tiny-gguf:Q8_0"]


def test_missing_quantization_names_what_exists(daemon: Daemon) -> None:
    before = snapshot(daemon.store_root)
    response = pull(daemon, "hf.co/TestOrg/Tiny-GGUF:Q5_K_M")
    assert response.status_code == 404
    message = error_message(response)
    assert "no Q5_K_M" in message and "this repository has Q4_K_M, Q8_0" in message
    assert snapshot(daemon.store_root) == before


def test_shards_in_a_quantization_folder(daemon: Daemon, hub: FakeHub) -> None:
    events = json_lines(pull(daemon, "hf.co/TestOrg/Sharded-GGUF").text)
    assert events[-1]["type"] == "success", events[-1]
    [model] = daemon.models()
    paths = [
        layer["annotations"][mt.ANNOTATION_FILEPATH] for layer in manifest_of(daemon, model["id"])["layers"]
    ]
    assert paths == ["Big-Q4_K_M-00001-of-00002.gguf", "Big-Q4_K_M-00002-of-00002.gguf"]
    assert not any(d.startswith("Q8_0/") for d in hub.downloads)


def test_safetensors_repository_becomes_v02(daemon: Daemon, hub: FakeHub) -> None:
    events = json_lines(pull(daemon, "hf.co/TestOrg/Tiny-Safetensors").text)
    assert events[-1]["type"] == "success", events[-1]
    [model] = daemon.models()
    assert model["config"]["format"] == "safetensors"
    manifest = manifest_of(daemon, model["id"])
    assert manifest["config"]["mediaType"] == mt.CONFIG_V02
    paths = {layer["annotations"][mt.ANNOTATION_FILEPATH] for layer in manifest["layers"]}
    assert {"model.safetensors", "config.json", "tokenizer.json", "sub/extra.txt"} <= paths
    assert "pytorch_model.bin" not in paths and "pytorch_model.bin" not in hub.downloads


def test_private_repository_needs_hf_token(daemon: Daemon) -> None:
    response = pull(daemon, "hf.co/TestOrg/Private-GGUF")
    assert response.status_code == 404  # the Hub says "not found" to a private repository without a token
    assert "HF_TOKEN" in error_message(response)
    assert daemon.models() == []
    ok = pull(daemon, "hf.co/TestOrg/Private-GGUF", **{"bearer-token": "hf_secret"})
    assert json_lines(ok.text)[-1]["type"] == "success"


def test_cli_sends_hf_token(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    result = daemon.cli("pull", "hf.co/TestOrg/Private-GGUF")
    assert "Model pulled successfully" in result.stdout


def test_unknown_repository_is_a_404(daemon: Daemon) -> None:
    response = pull(daemon, "hf.co/TestOrg/Nothing-Here")
    assert response.status_code == 404
    assert "not found" in error_message(response)


TINY = "Tiny-Q4_K_M.gguf"


def test_an_interrupted_download_resumes_with_range_at_the_pinned_commit(
    daemon: Daemon, hub: FakeHub
) -> None:
    size = len(hub.repos["TestOrg/Tiny-GGUF"].files[TINY])
    hub.cut_after[TINY] = (size // 3, 2)  # two cuts, then the rest
    events = json_lines(pull(daemon, "hf.co/TestOrg/Tiny-GGUF").text)
    assert events[-1]["type"] == "success", events[-1]
    ranges = [r.range for r in hub.requests if r.path == TINY]
    assert ranges == [None, f"bytes={size // 3}-", f"bytes={2 * (size // 3)}-"]
    assert hub.sent(TINY) == size  # no byte fetched twice
    assert {r.revision for r in hub.requests} == {"c0ffee" * 6 + "ab"}  # the commit, not `main`
    assert not any((daemon.store_root / "downloads").iterdir())  # built: the partial folder is gone


def test_a_failed_pull_leaves_partials_that_the_next_pull_continues(daemon: Daemon, hub: FakeHub) -> None:
    size = len(hub.repos["TestOrg/Tiny-GGUF"].files[TINY])
    hub.cut_after[TINY] = (size // 10, 5)  # every attempt of this pull is cut short
    events = json_lines(pull(daemon, "hf.co/TestOrg/Tiny-GGUF").text)
    assert events[-1]["type"] == "error" and "pull again to resume" in events[-1]["message"]
    assert daemon.models() == []
    [partial] = (daemon.store_root / "downloads").rglob(TINY + ".incomplete")
    assert partial.stat().st_size == 5 * (size // 10)
    before = hub.sent(TINY)

    events = json_lines(pull(daemon, "hf.co/TestOrg/Tiny-GGUF").text)
    assert events[-1]["type"] == "success", events[-1]
    assert hub.sent(TINY) - before == size - 5 * (size // 10)  # only the missing bytes
    assert hub.downloads.count("mmproj-Tiny-f16.gguf") == 1  # finished files are not fetched again
    layers = [e["layer"] for e in events if e["type"] == "progress"]
    progress = [layer["current"] for layer in layers if layer.get("id") == TINY]
    assert progress and min(progress) == 5 * (size // 10)  # the progress starts where the partial ends


def test_a_hub_that_ignores_range_restarts_the_file(daemon: Daemon, hub: FakeHub) -> None:
    size = len(hub.repos["TestOrg/Tiny-GGUF"].files[TINY])
    hub.cut_after[TINY] = (size // 2, 1)
    hub.ignore_range = True
    events = json_lines(pull(daemon, "hf.co/TestOrg/Tiny-GGUF").text)
    assert events[-1]["type"] == "success", events[-1]
    assert hub.sent(TINY) == size // 2 + size
    [model] = daemon.models()
    layers = manifest_of(daemon, model["id"])["layers"]
    gguf = next(layer for layer in layers if layer["mediaType"] == mt.GGUF)
    expected = hashlib.sha256(hub.repos["TestOrg/Tiny-GGUF"].files[TINY]).hexdigest()
    assert gguf["digest"] == "sha256:" + expected


def test_a_file_that_does_not_match_the_hubs_sha256_is_refused(daemon: Daemon, hub: FakeHub) -> None:
    hub.corrupt.add(TINY)
    events = json_lines(pull(daemon, "hf.co/TestOrg/Tiny-GGUF").text)
    assert events[-1]["type"] == "error" and "sha256" in events[-1]["message"]
    assert daemon.models() == []
    assert not list((daemon.store_root / "downloads").rglob(TINY + "*"))  # nothing bad kept to resume from
    hub.corrupt.clear()
    assert json_lines(pull(daemon, "hf.co/TestOrg/Tiny-GGUF").text)[-1]["type"] == "success"
