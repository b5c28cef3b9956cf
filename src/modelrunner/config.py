"""Settings read from the environment, with DMR's variable names where DMR has one."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 12434
DEFAULT_HOST = "127.0.0.1"


def runner_home() -> Path:
    """`MODEL_RUNNER_HOME`, else the platform's user data dir (e.g. ~/.local/share/modelrunner)."""
    explicit = os.environ.get("MODEL_RUNNER_HOME")
    if explicit:
        return Path(explicit).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("modelrunner", appauthor=False))


def models_path() -> Path:
    explicit = os.environ.get("MODELS_PATH")
    if explicit:
        return Path(explicit).expanduser()
    return runner_home() / "models"


def logs_dir() -> Path:
    return runner_home() / "logs"


def local_token_file() -> Path:
    """Readable only by the daemon's user: proves a local client is that user (server/localuser.py)."""
    return runner_home() / "daemon.token"


def daemon_port() -> int:
    raw = os.environ.get("MODEL_RUNNER_PORT")
    if not raw:
        return DEFAULT_PORT
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"MODEL_RUNNER_PORT must be a port number, got {raw!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"MODEL_RUNNER_PORT must be between 1 and 65535, got {port}")
    return port


def default_registry() -> str:
    return os.environ.get("DEFAULT_REGISTRY") or "index.docker.io"


@dataclass(frozen=True)
class ClientTarget:
    """Where the CLI finds the daemon, and whether it may start one itself."""

    base_url: str
    explicit: bool  # MODEL_RUNNER_HOST was set: never auto-start a local daemon


def client_target() -> ClientTarget:
    host = os.environ.get("MODEL_RUNNER_HOST")
    if host:
        if "://" not in host:
            scheme = "https" if os.environ.get("MODEL_RUNNER_TLS", "").lower() == "true" else "http"
            host = f"{scheme}://{host}"
        return ClientTarget(base_url=host.rstrip("/"), explicit=True)
    return ClientTarget(base_url=f"http://{DEFAULT_HOST}:{daemon_port()}", explicit=False)
