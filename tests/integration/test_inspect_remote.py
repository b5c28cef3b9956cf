"""`model inspect --remote` / `GET /models/{name}?remote=true`: read a model from its registry without
pulling it, against a real `docker-registry`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import Daemon, Daemons, error_message, snapshot
from tests.models import write_tiny_gguf
from tests.registry import Registry


@pytest.fixture
def setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemons: Daemons
) -> Iterator[tuple[Registry, Daemon]]:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    registry = Registry(tmp_path / "registry", auth="none").start()
    try:
        yield registry, daemons.start()
    finally:
        registry.stop()


def test_inspect_remote_reads_the_registry_without_pulling(
    setup: tuple[Registry, Daemon], tmp_path: Path
) -> None:
    registry, daemon = setup
    ref = f"{registry.host}/team/tiny:v1"
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "tiny.gguf")), ref)
    daemon.cli("push", ref)
    local = daemon.models()[0]
    daemon.cli("rm", ref)
    before = snapshot(daemon.store_root)

    remote = json.loads(daemon.cli("inspect", "--remote", ref).stdout)
    assert remote["id"] == local["id"] and remote["config"] == local["config"]
    # DMR's ToModelFromArtifact (pkg/inference/models/adapter.go): a remote model has no tags
    assert "tags" not in remote and remote["created"] == local["created"]
    assert "Architecture: llama\n" in daemon.cli("show", "-r", ref).stdout
    assert snapshot(daemon.store_root) == before  # nothing was pulled


@pytest.mark.parametrize(
    ("name", "status"),
    [("team/absent:v1", 404), ("hf.co/org/repo", 400), ("Bad..Name", 400)],
)
def test_inspect_remote_errors(setup: tuple[Registry, Daemon], name: str, status: int) -> None:
    registry, daemon = setup
    target = f"{registry.host}/{name}" if name.startswith("team/") else name
    response = daemon.http("GET", f"/models/{target}", params={"remote": "true"})
    assert response.status_code == status, response.text
    assert error_message(response)
