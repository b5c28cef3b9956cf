"""What the everyday verbs import: `model ls` and friends must start in a few tens of milliseconds (issue 14:
<= 50 ms against a running daemon, measured by bench/cli.py), so a heavy module that sneaks back onto their
start-up path fails here. A list of modules, not a timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon import Daemon

# Each costs milliseconds to import, and none is needed to list models, runners or engines, or to print help:
# the server's stack, the rich renderer, the engines, the store and the artifact code (the daemon's side),
# http.client (it loads email and ssl: the CLI's own transport is client_http.py, ssl only for https),
# dataclasses (it loads inspect, ast and dis), shutil and the compression modules it loads (argparse
# imports it to measure the terminal, unless its formatter is cli/__init__.py's), and what handlers of
# other verbs import when they run.
HEAVY = (
    "httpx",
    "httpcore",
    "pydantic",
    "fastapi",
    "starlette",
    "uvicorn",
    "anyio",
    "rich",
    "prompt_toolkit",
    "platformdirs",
    "gguf",
    "numpy",
    "http.client",
    "email",
    "ssl",
    "asyncio",
    "concurrent.futures",
    "logging",
    "subprocess",
    "shutil",
    "zlib",
    "bz2",
    "lzma",
    "threading",
    "statistics",
    "dataclasses",
    "inspect",
    "hashlib",
    "tempfile",
    "tarfile",
    "zipfile",
    "modelrunner.server",
    "modelrunner.store",
    "modelrunner.artifact",
    "modelrunner.engines",
    "modelrunner.scheduler",
    "modelrunner.distribution",
    "modelrunner.compat",
    "modelrunner.reference",
    "modelrunner.fileio",
)

# `model ARGS` as the console script runs it, then the names of the modules it imported on stderr
PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('imported:', *sorted(sys.modules), file=sys.stderr))\n"
    "from modelrunner.cli import main\n"
    "main()\n"
)


def imported(daemon: Daemon, *args: str) -> tuple[str, set[str]]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], env=daemon.env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("imported: ")]
    return result.stdout, set(line.split()[1:])


@pytest.fixture
def listed(daemon: Daemon, tiny_gguf: Path) -> Daemon:
    daemon.cli("package", "--gguf", str(tiny_gguf), "tiny")
    return daemon


@pytest.mark.parametrize(
    ("args", "shows"),
    [
        (["ls"], "tiny "),
        (["list", "--json"], '"tags": [\n'),
        (["ls", "-q"], ""),
        (["ps"], "MODEL NAME"),
        (["status"], "Docker Model Runner is running"),
        (["--help"], "install-runner"),
        (["ls", "--help"], "--openaiurl"),
    ],
)
def test_everyday_verbs_leave_heavy_modules_alone(listed: Daemon, args: list[str], shows: str) -> None:
    output, modules = imported(listed, *args)
    assert shows in output  # the verb ran to its end (the table drawn, the names shown)
    loaded = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert loaded == [], f"`model {' '.join(args)}` imports {loaded}"
