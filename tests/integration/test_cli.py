"""The `model` CLI as a user runs it: a real process talking to a real daemon."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.daemon import Daemon, free_port, runner_env, snapshot
from tests.models import write_tiny_gguf, write_tiny_safetensors_dir

LIST_HEADERS = [
    "MODEL NAME",
    "PARAMETERS",
    "QUANTIZATION",
    "ARCHITECTURE",
    "MODEL ID",
    "CREATED",
    "CONTEXT",
    "SIZE",
]


def test_package_list_inspect_show(daemon: Daemon, tiny_gguf: Path, tmp_path: Path) -> None:
    license_file = tmp_path / "LICENSE"
    license_file.write_text("MIT\n")
    packaged = daemon.cli(
        "package", "--gguf", str(tiny_gguf), "--license", str(license_file), "myorg/tiny:F32"
    )
    assert packaged.stdout == "" and packaged.stderr.endswith("\nModel loaded successfully\n")

    table = daemon.cli("ls").stdout.splitlines()
    for header in LIST_HEADERS:
        assert header in table[0]
    row = table[1].split()
    # DMR's values (format/gguf.go over gguf-parser-go): file type name, tensor data in its units
    assert row[:4] == ["myorg/tiny:F32", "113.09K", "MOSTLY_F32", "llama"]
    assert "512" in row and row[-1] == "441.75KiB"

    [model] = json.loads(daemon.cli("list", "--json").stdout)
    assert daemon.cli("ls", "-q").stdout.split() == [model["id"][7:19]]
    inspected = json.loads(daemon.cli("inspect", "myorg/tiny:F32").stdout)
    assert inspected == model
    openai = json.loads(daemon.cli("inspect", "--openai", "myorg/tiny:F32").stdout)
    assert openai["object"] == "model" and openai["owned_by"] == "docker"
    shown = daemon.cli("show", model["id"][7:19]).stdout
    assert (
        "Architecture: llama\n" in shown and "\nGGUF Metadata:\n" in shown and "Context Size: 512\n" in shown
    )


def test_tag_rm_df_purge(daemon: Daemon, tiny_gguf: Path) -> None:
    daemon.cli("package", "--gguf", str(tiny_gguf), "tiny")
    assert 'tagged successfully with "tiny:v2"' in daemon.cli("tag", "tiny", "tiny:v2").stdout
    names = [line.split()[0] for line in daemon.cli("ls").stdout.splitlines()[1:]]
    assert names == ["tiny", "tiny:v2"]
    model_id = daemon.models()[0]["id"]

    refused = daemon.cli("rm", model_id[7:19], check=False)
    assert refused.returncode == 1 and "must be forced" in refused.stderr
    out = daemon.cli("rm", "-f", model_id[7:19]).stdout.splitlines()
    # DMR's desktop.go Remove: the tags as the daemon answers them
    assert out == [
        "Untagged: docker.io/ai/tiny:latest",
        "Untagged: docker.io/ai/tiny:v2",
        f"Deleted: {model_id}",
    ]

    df = daemon.cli("df").stdout.splitlines()
    assert df[0].split() == ["TYPE", "SIZE"] and df[1].startswith("Models")
    daemon.cli("package", "--gguf", str(tiny_gguf), "tiny")
    declined = daemon.cli("purge", check=False, stdin="n\n")  # purge.go: any stdin answers
    # purge.go: the answer is read, not echoed, so the cancellation follows the question on its line
    assert declined.returncode == 0 and declined.stdout.endswith("[y/N] Operation cancelled.\n")
    assert daemon.models()
    assert daemon.cli("purge", stdin="y\n").stderr == ""
    assert daemon.models() == []


def test_package_safetensors_and_from(daemon: Daemon, tmp_path: Path) -> None:
    folder = write_tiny_safetensors_dir(tmp_path / "st")
    daemon.cli("package", "--safetensors", str(folder), "st")
    daemon.cli("package", "--from", "st", "--context-size", "256", "st:small")
    assert daemon.cli("inspect", "st:small").stdout.count('"context_size": 256') == 1


def test_export_and_load_round_trip(daemon: Daemon, tiny_gguf: Path, tmp_path: Path) -> None:
    daemon.cli("package", "--gguf", str(tiny_gguf), "tiny")
    archive = tmp_path / "tiny.tar"
    daemon.cli("export", "tiny", "-o", str(archive))
    model_id = daemon.models()[0]["id"]
    daemon.cli("rm", "tiny")
    assert daemon.models() == []
    out = daemon.cli("load", str(archive), "--tag", "restored").stdout
    assert model_id in out
    assert daemon.models()[0]["tags"] == ["docker.io/ai/restored:latest"]


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        # package.go's Args: its own texts, exit 1 (DMR's main)
        (["package", "x"], 1, "One of --gguf, --safetensors-dir, --dduf, or --from is required."),
        (["package", "--gguf", "a.gguf", "--dduf", "b.dduf", "x"], 1, "Cannot specify more than one of"),
        (["package", "--gguf", "a.gguf", "--context-size", "abc", "x"], 1, 'invalid argument "abc" for'),
        (["package", "--gguf", "a.gguf", "--context-size", "0", "x"], 1, "positive"),
        (["package", "--gguf", "/nonexistent.gguf", "x"], 1, "open /nonexistent.gguf: no such file"),
        (["package", "--gguf", "/dev/null", "Bad..Name"], 1, "invalid"),
        (["inspect", "ai/absent"], 1, "Failed to get model ai/absent: ai/absent: model not found"),
        (["tag", "absent", "x"], 1, "model not found"),
        (["rm", "absent"], 1, "Failed to remove model: no such model: absent"),
        (["ls", "--bogus-flag"], 1, "unknown flag: --bogus-flag"),  # pflag's text, cobra's exit 1
        (["load", "/nonexistent.tar"], 1, "not found"),
    ],
)
def test_bad_command_lines(daemon: Daemon, args: list[str], code: int, needle: str) -> None:
    before = snapshot(daemon.store_root)
    result = daemon.cli(*args, check=False)
    assert result.returncode == code, result.stderr
    assert needle in result.stderr.lower() or needle in result.stderr
    assert snapshot(daemon.store_root) == before


def test_cli_starts_a_daemon_when_none_runs_and_stop_runner_stops_it(tmp_path: Path) -> None:
    env = runner_env(tmp_path / "home", free_port())

    def model(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "modelrunner", *args], env=env, capture_output=True, text=True, timeout=120
        )

    try:
        listing = model("ls")
        assert listing.returncode == 0, listing.stderr
        assert "Starting the model runner" in listing.stderr
        assert listing.stdout.startswith("MODEL NAME")
        assert "already running" in model("start-runner").stdout
        assert "Server:\n Version:    0.1.0" in model("version").stdout
        # its lines are in the rotated daemon.log alone: its stdout file (never rotated) holds no copies
        logs = tmp_path / "home" / "logs"
        assert "event=request" in (logs / "daemon.log").read_text()
        assert "event=" not in (logs / "daemon.stdout.log").read_text()
    finally:
        stopped = model("stop-runner")
    assert "has stopped" in stopped.stdout
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{env['MODEL_RUNNER_PORT']}/version", timeout=2)
    assert "not running" in model("stop-runner").stdout


def test_explicit_host_is_never_autostarted(tmp_path: Path) -> None:
    env = runner_env(tmp_path / "home", free_port())
    env["MODEL_RUNNER_HOST"] = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "modelrunner", "ls"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "cannot reach the model runner" in result.stderr


def test_package_through_a_remote_daemon_streams_a_tar(daemon: Daemon, tmp_path: Path) -> None:
    """A daemon that is not on loopback cannot read our files: the CLI hashes and streams them."""
    gguf = write_tiny_gguf(tmp_path / "remote.gguf", seed=5)
    env = daemon.env
    env["MODEL_RUNNER_HOST"] = f"http://127.0.0.1:{daemon.port}"
    # Only loopback addresses reach a test daemon, so the client is told it is remote.
    code = (
        "import sys; from modelrunner.client import Client; Client.is_local = property(lambda self: False);"
        "from modelrunner.cli import main; main(sys.argv[1:])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "package", "--gguf", str(gguf), "remote"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    [model] = daemon.models()
    assert model["tags"] == ["docker.io/ai/remote:latest"]
    assert model["config"]["format"] == "gguf"
