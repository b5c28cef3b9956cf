"""Finding a `llama-server` executable and asking it its version.

Order: `LLAMA_SERVER_PATH` (a folder, as DMR's variable, or the executable itself), then the build
installed in the runner's home by `model install-runner`, then a `llama-server` on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from modelrunner.errors import EngineInstallError

EXECUTABLE = "llama-server"
RPC_EXECUTABLE = "ggml-rpc-server"  # llama.cpp's RPC worker (tools/rpc/), built beside llama-server
# "version: 0.6.0-dev (build 11434, commit unknown)" now; "version: 4567 (abcdef0)" in older builds
_BUILD_NUMBER = re.compile(r"\(build (\d+)|version:\s*(\d+)\s*\(")
_versions: dict[tuple[str, int, int], str] = {}  # (path, mtime, size) -> version: `--version` costs ~20 ms


@dataclass(frozen=True)
class FoundServer:
    path: Path
    source: str  # "LLAMA_SERVER_PATH", "installed" or "PATH": where it was found, for messages


def server_version(binary: Path) -> str:
    """`b<build>` from `llama-server --version`; EngineInstallError when it does not run."""
    try:
        stat = binary.stat()
    except OSError:
        raise EngineInstallError(f"{EXECUTABLE} is missing") from None
    key = (str(binary), stat.st_mtime_ns, stat.st_size)
    if key in _versions:
        return _versions[key]
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise EngineInstallError(f"{EXECUTABLE} does not run: {exc.__class__.__name__}") from None
    output = done.stdout + done.stderr
    match = _BUILD_NUMBER.search(output)
    if done.returncode != 0 or match is None:
        tail = output.strip().splitlines()[-1:] or ["no output"]
        raise EngineInstallError(f"{EXECUTABLE} --version failed ({done.returncode}): {tail[0][:200]}")
    version = f"b{match.group(1) or match.group(2)}"
    _versions[key] = version
    return version


def _from_env() -> Path | None:
    raw = os.environ.get("LLAMA_SERVER_PATH")
    if not raw:
        return None
    path = Path(raw).expanduser()
    return path / EXECUTABLE if path.is_dir() else path


def installed_servers(install_root: Path) -> list[Path]:
    """Executables installed under `<install_root>/<version>/bin/`, newest build first."""

    def build_number(binary: Path) -> int:
        digits = binary.parent.parent.name.lstrip("b")
        return int(digits) if digits.isdigit() else -1

    found = [p for p in install_root.glob(f"*/bin/{EXECUTABLE}") if p.is_file()]
    return sorted(found, key=build_number, reverse=True)


def find_server(install_root: Path) -> FoundServer | None:
    explicit = _from_env()
    if explicit is not None:
        # An explicit setting is never silently replaced by another binary, even when it is broken.
        return FoundServer(explicit, "LLAMA_SERVER_PATH")
    installed = installed_servers(install_root)
    if installed:
        return FoundServer(installed[0], "installed")
    on_path = shutil.which(EXECUTABLE)
    return FoundServer(Path(on_path), "PATH") if on_path else None
