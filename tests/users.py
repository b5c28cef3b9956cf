"""Another local user for two-uid tests: uid 65534 (nobody), reached with setpriv, which needs root."""

from __future__ import annotations

import os
import subprocess

import pytest

OTHER_UID = 65534  # nobody


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"this test {what}, which needs root", pytrace=False)


def as_other_user(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    need_root("runs a command as another user with setpriv")
    command = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
