"""A CNCF ModelPack model along the whole path: `model package --format cncf` (through the daemon, and
hashed by the CLI for a remote daemon), the store, ls/inspect/show, export/load, push/pull through a real
`docker-registry`, and a chat through the daemon with the real `llama-server`.

The packaged dummy.gguf must come out as the model DMR's builder makes of it (the golden IDs of
tests/conformance/test_config_cncf.py, with SOURCE_DATE_EPOCH and the time zone fixed for the daemon that
builds it and for the CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.artifact import mediatypes as mt
from tests.conformance.dmr_layout import ASSETS, FIXED_EPOCH, GOLDEN_ID, fixed_copy
from tests.conformance.test_config_cncf import (
    GOLDEN_CNCF_API,
    GOLDEN_CNCF_CONFIG,
    GOLDEN_CNCF_CONFIG_DIGEST,
    GOLDEN_CNCF_CONVERTED_ID,
    GOLDEN_CNCF_EXTRAS_ID,
    GOLDEN_CNCF_ID,
)
from tests.daemon import Daemon, Daemons, json_lines, snapshot
from tests.models import CHAT_TEMPLATE, write_tiny_gguf
from tests.registry import Registry


def start_daemon(daemons: Daemons, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(FIXED_EPOCH))
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("DOCKER_CONFIG", str(daemons.tmp_path / "docker-empty"))
    for name in ("INSECURE_REGISTRY", "DEFAULT_REGISTRY", "MODEL_RUNNER_REGISTRY_MIRRORS"):
        monkeypatch.delenv(name, raising=False)
    return daemons.start()


@pytest.fixture
def daemon(daemons: Daemons, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    return start_daemon(daemons, monkeypatch)


@pytest.fixture
def llama_daemon(daemons: Daemons, monkeypatch: pytest.MonkeyPatch, llama_server: Path) -> Daemon:
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    return start_daemon(daemons, monkeypatch)


@pytest.fixture
def dummy(tmp_path: Path) -> dict[str, Path]:
    """Upstream's assets, mode 0644 and the fixed mtime (what the golden IDs assume)."""
    names = ("dummy.gguf", "license.txt", "template.jinja", "dummy.mmproj")
    return {name: fixed_copy(ASSETS / name, tmp_path / "assets") for name in names}


def manifest_of(daemon: Daemon, model_id: str) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(
        (daemon.store_root / "manifests/sha256" / model_id[7:]).read_bytes()
    )
    return manifest


def test_cli_package_cncf_gives_dmrs_model_and_values(daemon: Daemon, dummy: dict[str, Path]) -> None:
    packaged = daemon.cli("package", "--gguf", str(dummy["dummy.gguf"]), "--format", "cncf", "dummy-cncf")
    assert packaged.stdout == "" and "Model loaded successfully" in packaged.stderr
    inspected = json.loads(daemon.cli("inspect", "dummy-cncf").stdout)
    # the values DMR's API serves for it (inference/models/adapter.go: normalizeConfig)
    assert inspected == GOLDEN_CNCF_API
    assert (
        daemon.store_root / "blobs/sha256" / GOLDEN_CNCF_CONFIG_DIGEST[7:]
    ).read_bytes() == GOLDEN_CNCF_CONFIG
    row = daemon.cli("ls").stdout.splitlines()[1].split()
    assert row[:4] == ["dummy-cncf", "183", "Unknown", "llama"]
    assert row[4] == GOLDEN_CNCF_ID[7:19] and row[-1] == "183"
    show = daemon.cli("show", "dummy-cncf").stdout
    assert "Format:       gguf\n" in show and "Architecture: llama\n" in show

    extras = daemon.cli(
        "package",
        "--gguf",
        str(dummy["dummy.gguf"]),
        "--license",
        str(dummy["license.txt"]),
        "--chat-template",
        str(dummy["template.jinja"]),
        "--mmproj",
        str(dummy["dummy.mmproj"]),
        "--format",
        "cncf",
        "dummy-cncf:extras",
    )
    assert extras.returncode == 0
    assert daemon.http("GET", "/models/dummy-cncf:extras").json()["id"] == GOLDEN_CNCF_EXTRAS_ID


def test_cli_package_from_a_docker_model_converts_it(daemon: Daemon, dummy: dict[str, Path]) -> None:
    # DMR's `package --from MODEL --format cncf` (builder.convertToCNCF), with a license appended
    daemon.cli("package", "--gguf", str(dummy["dummy.gguf"]), "dummy")
    assert daemon.http("GET", "/models/dummy").json()["id"] == GOLDEN_ID
    daemon.cli(
        "package", "--from", "dummy", "--license", str(dummy["license.txt"]), "--format", "cncf", "conv"
    )
    assert daemon.http("GET", "/models/conv").json()["id"] == GOLDEN_CNCF_CONVERTED_ID
    # without --format, --from keeps the CNCF format of its base (builder.FromModel's detection)
    notice = dummy["license.txt"].with_name("NOTICE")
    notice.write_text("third-party notices\n")
    daemon.cli("package", "--from", "conv", "--license", str(notice), "conv:more")
    manifest = manifest_of(daemon, daemon.http("GET", "/models/conv:more").json()["id"])
    assert manifest["artifactType"] == mt.CNCF_MANIFEST_ARTIFACT_TYPE
    assert [layer["mediaType"] for layer in manifest["layers"]] == [
        mt.CNCF_WEIGHT_RAW,
        mt.CNCF_DOC_RAW,
        mt.CNCF_DOC_RAW,
    ]
    before = snapshot(daemon.store_root)
    refused = daemon.cli(
        "package",
        "--from",
        "conv",
        "--license",
        str(dummy["license.txt"]),
        "--format",
        "docker",
        "back",
        check=False,
    )
    assert refused.returncode != 0 and "cannot be repackaged in the Docker format" in refused.stderr
    assert snapshot(daemon.store_root) == before


def test_the_api_packages_cncf_and_refuses_bad_input(daemon: Daemon, dummy: dict[str, Path]) -> None:
    body = {"target": "api-cncf", "gguf": str(dummy["dummy.gguf"]), "format": "cncf"}
    response = daemon.http("POST", "/models/package", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["id"] == GOLDEN_CNCF_ID
    before = snapshot(daemon.store_root)
    for bad in ({**body, "context_size": 64}, {**body, "format": "onnx"}):
        refused = daemon.http("POST", "/models/package", json={**bad, "target": "other"})
        assert refused.status_code == 400, refused.text
    assert snapshot(daemon.store_root) == before


def test_cli_package_cncf_for_a_remote_daemon_streams_the_same_model(
    daemon: Daemon, dummy: dict[str, Path]
) -> None:
    """The CLI's own path for a daemon that cannot read our files: it builds and hashes, then streams."""
    code = (
        "import sys; from modelrunner.client import Client; Client.is_local = property(lambda self: False);"
        "from modelrunner.cli import main; main(sys.argv[1:])"
    )
    args = ["package", "--gguf", str(dummy["dummy.gguf"]), "--license", str(dummy["license.txt"])]
    args += ["--chat-template", str(dummy["template.jinja"]), "--mmproj", str(dummy["dummy.mmproj"])]
    result = subprocess.run(
        [sys.executable, "-c", code, *args, "--format", "cncf", "remote"],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert daemon.http("GET", "/models/remote").json()["id"] == GOLDEN_CNCF_EXTRAS_ID


def test_export_then_load_keeps_the_model(daemon: Daemon, dummy: dict[str, Path], tmp_path: Path) -> None:
    daemon.cli("package", "--gguf", str(dummy["dummy.gguf"]), "--format", "cncf", "dummy-cncf")
    archive = tmp_path / "dummy.tar"
    daemon.cli("export", "dummy-cncf", "-o", str(archive))
    daemon.cli("rm", "dummy-cncf")
    assert daemon.models() == []
    daemon.cli("load", str(archive), "-t", "back")
    [model] = daemon.models()
    assert model["id"] == GOLDEN_CNCF_ID and model["tags"] == ["docker.io/ai/back:latest"]


def test_push_then_pull_through_a_registry(daemon: Daemon, dummy: dict[str, Path], tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry", auth="none").start()
    try:
        ref = f"{registry.host}/team/dummy-cncf:v1"
        daemon.cli("package", "--gguf", str(dummy["dummy.gguf"]), "--format", "cncf", ref)
        assert "Model pushed successfully" in daemon.cli("push", ref).stdout
        stored = httpx.get(
            f"{registry.url}/v2/team/dummy-cncf/manifests/v1",
            headers={"Accept": mt.OCI_MANIFEST},
        )
        assert stored.status_code == 200
        assert stored.headers["docker-content-digest"] == GOLDEN_CNCF_ID  # the bytes, as built
        assert stored.json()["artifactType"] == mt.CNCF_MANIFEST_ARTIFACT_TYPE
        daemon.cli("rm", ref)
        pulled = daemon.http(
            "POST", "/models/create", json={"from": ref}, headers={"Accept": "application/json"}, timeout=120
        )
        assert json_lines(pulled.text)[-1]["type"] == "success", pulled.text
        [model] = daemon.models()
        assert model["id"] == GOLDEN_CNCF_ID and model["tags"] == [ref]
        assert model["config"]["parameters"] == "183"
    finally:
        registry.stop()


def test_chat_with_the_tiny_gguf_packaged_as_cncf(llama_daemon: Daemon, tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    llama_daemon.cli(
        "package", "--gguf", str(gguf), "--chat-template", str(template), "--format", "cncf", "tiny"
    )
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "ignore_eos": True,  # random weights may pick end-of-text early; the count must be exact
    }
    response = llama_daemon.http("POST", "/engines/llama.cpp/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 8
    # the engine got the weight.v1.raw GGUF and the weight.config.v1.raw template from the bundle
    [pid] = [runner["pid"] for runner in llama_daemon.http("GET", "/engines/ps").json()]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    model_path = Path(argv[argv.index(b"--model") + 1].decode())
    assert model_path.name == "model.gguf" and model_path.read_bytes() == gguf.read_bytes()
    template_path = Path(argv[argv.index(b"--chat-template-file") + 1].decode())
    assert template_path.read_text() == CHAT_TEMPLATE
