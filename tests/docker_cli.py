"""`docker model ...` as a user runs it: the real Docker CLI client (a client only: no Docker daemon is
needed) with the plugin that `model install-plugin` links into a Docker config of the test's own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conformance.dmr_daemons import cli_env, run_cli

DOCKER = shutil.which("docker") or "/usr/local/bin/docker"
PLUGIN = Path(sys.executable).parent / "docker-model"


def plugin_env(tmp_path: Path, url: str, **extra: str) -> dict[str, str]:
    """The environment of a `docker` process: its own Docker config (under tmp_path) with the plugin
    installed by `model install-plugin`, and the daemon at url named."""
    env = cli_env(tmp_path, url, **extra)
    installed = run_cli(env, "install-plugin")
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / "docker" / "cli-plugins" / "docker-model").resolve() == PLUGIN.resolve()
    return env


def docker(
    env: dict[str, str], *args: str, cwd: Path | None = None, stdin: str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DOCKER, *args], env=env, cwd=cwd, capture_output=True, text=True, input=stdin, timeout=timeout
    )
