"""`model package` builds with the CLI's SOURCE_DATE_EPOCH and time zone, whatever the daemon's own are. DMR's
CLI builds in its own process; ours lets the local daemon read the files, so it sends what a build reads
of its environment with the request (`environment`), and the same files give the same model ID as DMR's
builder, and as the CLI's own build for a daemon on another machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.dmr_layout import DUMMY_GGUF, FIXED_EPOCH, GOLDEN_ID, fixed_copy
from tests.daemon import Daemon, Daemons, error_message, snapshot

# the CLI believes the daemon is on another machine: it hashes the files itself and uploads a tar
AS_REMOTE = (
    "import sys; from modelrunner.client import Client; Client.is_local = property(lambda self: False);"
    "from modelrunner.cli import main; main(sys.argv[1:])"
)


@pytest.fixture
def daemon(daemons: Daemons, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    """A daemon started without SOURCE_DATE_EPOCH, in a zone no test's CLI uses."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    return daemons.start()


def package(daemon: Daemon, gguf: Path, tag: str, *, remote: bool = False, **cli_env: str) -> str:
    """`model package` with the CLI's own SOURCE_DATE_EPOCH and TZ (only those given); the model's ID."""
    env = {k: v for k, v in daemon.env.items() if k not in ("SOURCE_DATE_EPOCH", "TZ")}
    env.update(cli_env)
    how = ["-c", AS_REMOTE] if remote else ["-m", "modelrunner"]
    result = subprocess.run(
        [sys.executable, *how, "package", "--gguf", str(gguf), tag],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    response = daemon.http("GET", f"/models/{tag}")
    response.raise_for_status()
    model_id: str = response.json()["id"]
    return model_id


def test_the_clis_epoch_and_zone_give_dmrs_model_id(daemon: Daemon, tmp_path: Path) -> None:
    # follows cmd/cli/commands/package.go: the CLI builds (builder.FromPath) in its own process, so its
    # clock settings and its time zone (the layers' file times) make the ID; the golden ID is DMR's
    gguf = fixed_copy(DUMMY_GGUF, tmp_path / "files")
    assert package(daemon, gguf, "dummy", SOURCE_DATE_EPOCH=str(FIXED_EPOCH), TZ="UTC") == GOLDEN_ID
    # the daemon's own environment (no epoch: now; Kolkata) would have made another model
    response = daemon.http("POST", "/models/package", json={"target": "own", "gguf": str(gguf)})
    assert response.status_code == 201, response.text
    assert response.json()["id"] != GOLDEN_ID


@pytest.mark.parametrize(
    "zone",
    [{"TZ": "America/New_York"}, {"TZ": ":Europe/Berlin"}, {}],  # {}: no TZ, the system's zone
    ids=["new-york", "berlin", "unset"],
)
def test_the_daemon_builds_as_the_cli_builds_for_a_remote_daemon(
    daemon: Daemon, tmp_path: Path, zone: dict[str, str]
) -> None:
    gguf = fixed_copy(DUMMY_GGUF, tmp_path / "files")
    settings = {"SOURCE_DATE_EPOCH": str(FIXED_EPOCH), **zone}
    local = package(daemon, gguf, "local", remote=False, **settings)  # settings: environment only
    assert package(daemon, gguf, "uploaded", remote=True, **settings) == local
    if zone.get("TZ", "").endswith(("New_York", "Berlin")):
        assert local != GOLDEN_ID  # the file times are written in that zone, not in UTC


@pytest.mark.parametrize(
    ("environment", "fragment"),
    [
        ({"PATH": "/usr/bin"}, "not read by a build"),
        ({"SOURCE_DATE_EPOCH": "yesterday"}, "SOURCE_DATE_EPOCH must be a number of seconds"),
        ({"SOURCE_DATE_EPOCH": "-1"}, "SOURCE_DATE_EPOCH must be"),
        ({"SOURCE_DATE_EPOCH": "1.5"}, "SOURCE_DATE_EPOCH must be"),
        ({"SOURCE_DATE_EPOCH": "٣"}, "SOURCE_DATE_EPOCH must be"),  # a digit, but not an ASCII one
        ({"SOURCE_DATE_EPOCH": "253402300800"}, "SOURCE_DATE_EPOCH must be"),  # past year 9999
        ({"SOURCE_DATE_EPOCH": 1700000000}, "environment"),  # a number, not the variable's text
        ({"TZ": "Europe/Berlin\nX: y"}, "TZ must be a time zone name"),
        ({"TZ": "x" * 5000}, "TZ must be"),
        ("TZ=UTC", "environment"),
        ([["TZ", "UTC"]], "environment"),
    ],
)
def test_a_nonsense_environment_is_a_400_and_changes_nothing(
    daemon: Daemon, tmp_path: Path, environment: Any, fragment: str
) -> None:
    gguf = fixed_copy(DUMMY_GGUF, tmp_path / "files")
    before = snapshot(daemon.store_root)
    response = daemon.http(
        "POST", "/models/package", json={"target": "x", "gguf": str(gguf), "environment": environment}
    )
    assert response.status_code == 400
    assert fragment in error_message(response)
    assert snapshot(daemon.store_root) == before


def test_the_cli_says_when_its_epoch_is_nonsense(daemon: Daemon, tmp_path: Path) -> None:
    gguf = fixed_copy(DUMMY_GGUF, tmp_path / "files")
    before = snapshot(daemon.store_root)
    env = {**daemon.env, "SOURCE_DATE_EPOCH": "tomorrow"}
    result = subprocess.run(
        [sys.executable, "-m", "modelrunner", "package", "--gguf", str(gguf), "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "SOURCE_DATE_EPOCH must be a number of seconds since 1970" in result.stderr
    assert snapshot(daemon.store_root) == before
