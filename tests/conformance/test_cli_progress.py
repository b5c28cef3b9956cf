"""`model pull` and `model push` off a terminal print what DMR's CLI prints there.

Follows: `cmd/cli/desktop/progress.go` (`displayProgressSimple`: one `Downloaded <sum> of <total>` line per
progress message, the sum over each layer's latest `current`, sizes by go-units' `CustomSize("%.2f%s", ...,
1000.0, ...)`, through cobra's Println, which docker's plugin framework (`cli-plugins/plugin/plugin.go`
`newPluginCommand`: SetOut) points at stdout; warnings by PrintErrf on stderr), `cmd/cli/commands/pull.go` and
`push.go` (`cmd.Println(response)`: the success message last), and the
daemon's side: `pkg/distribution/internal/store/store.go` (one progress reporter per manifest layer, `total`
their sum).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from modelrunner.cli.distribution import PULL_FAILURE, render_transfer
from modelrunner.distribution.progress import event
from tests.conformance.dmr_daemons import cli_env, package, run_cli
from tests.inprocess import InProcessDaemon
from tests.registry import Registry

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_plain_lines_sum_the_layers(capsys: pytest.CaptureFixture[str]) -> None:
    """displayProgressSimple: every progress message prints, a layer-less one as layer "" (so a status
    message prints `0.00B of 0.00B`); the success message is printed by pull.go after the stream."""
    events = [
        event("progress", "Waiting for another pull to finish...", "pull"),
        event(
            "progress", "Downloaded: 0.00 MB", "pull", 2_500_000, {"id": A, "size": 1_500_000, "current": 0}
        ),
        event(
            "progress",
            "Downloaded: 1.43 MB",
            "pull",
            2_500_000,
            {"id": A, "size": 1_500_000, "current": 1_500_000},
        ),
        event("warning", "slow registry", "pull", 2_500_000),
        event(
            "progress",
            "Downloaded: 0.95 MB",
            "pull",
            2_500_000,
            {"id": B, "size": 1_000_000, "current": 1_000_000},
        ),
        event("success", "Model pulled successfully", "pull"),
    ]
    assert render_transfer(iter(events), False, "pull", PULL_FAILURE) == 0
    out, err = capsys.readouterr()
    assert err == "Warning: slow registry\n"
    assert out == (
        "Downloaded 0.00B of 0.00B\n"
        "Downloaded 0.00B of 2.50MB\n"
        "Downloaded 1.50MB of 2.50MB\n"
        "Downloaded 2.50MB of 2.50MB\n"
        "Model pulled successfully\n"
    )


def test_error_ends_with_the_verb_s_failure(capsys: pytest.CaptureFixture[str]) -> None:
    """An error message ends the stream; pull.go's handleClientError prefixes it, and no success line."""
    events = [
        event("progress", "Downloaded: 0.00 MB", "pull", 10, {"id": A, "size": 10, "current": 0}),
        event("error", "registry went away", "pull"),
    ]
    assert render_transfer(iter(events), False, "pull", PULL_FAILURE) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("Downloaded 0.00B of 10.00B\n", "Failed to pull model: registry went away\n")


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-empty"))
    return Registry(tmp_path / "registry").start()


LINE = re.compile(r"Downloaded (\S+) of (\S+)")


def test_cli_push_and_pull_through_a_daemon(
    fake_daemon: InProcessDaemon, registry: Registry, tmp_path: Path
) -> None:
    """End to end: the wire's progress covers the layers only (no size-0 config layer, `total` their sum
    from the first message), and the CLI prints DMR's lines, the last one complete."""
    try:
        ref = f"{registry.host}/progress/tiny:v1"
        package(fake_daemon, tmp_path, ref, seed=21)
        env = cli_env(tmp_path, fake_daemon.url)
        for verb, final in (("push", "Model pushed successfully"), ("pull", "Model pulled successfully")):
            if verb == "pull":
                fake_daemon.http("DELETE", f"/models/{ref}").raise_for_status()
            result = run_cli(env, verb, ref)
            assert result.returncode == 0 and result.stderr == "", result.stderr
            *lines, last = result.stdout.splitlines()
            assert last == final and lines
            matches = [LINE.fullmatch(line) for line in lines]
            assert all(matches), lines
            totals = {m.group(2) for m in matches if m}
            assert len(totals) == 1 and totals != {"0.00B"}
            assert matches[-1] and matches[-1].group(1) == matches[-1].group(2)

        fake_daemon.http("DELETE", f"/models/{ref}").raise_for_status()
        pulled = fake_daemon.http("POST", "/models/create", json={"from": ref}, timeout=120)
        messages = [json.loads(html.unescape(line)) for line in pulled.text.splitlines() if line]
        progress = [m for m in messages if m["type"] == "progress"]
        assert progress and all(m["layer"]["size"] > 0 and m["layer"]["id"] for m in progress)
        sizes = {m["layer"]["id"]: m["layer"]["size"] for m in progress}
        assert {m["total"] for m in progress} == {sum(sizes.values())}
    finally:
        registry.stop()
