"""Registry credentials from Docker's client configuration (`~/.docker/config.json`, or `$DOCKER_CONFIG`).

Lookup order is Docker's: a per-registry `credHelpers` entry, else the global `credsStore`, else the inline
`auths` entry. Helpers speak the docker-credential protocol: `docker-credential-<name> get` reads the
server URL on stdin and prints `{"ServerURL", "Username", "Secret"}`.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner.reference import DOCKER_HUB

log = logging.getLogger(__name__)

DOCKER_HUB_SERVER_URL = "https://index.docker.io/v1/"
_HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
HELPER_TIMEOUT = 30.0


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never print secrets in logs or tracebacks
        return f"Credentials(username={self.username!r}, password=***)"


def docker_config_file() -> Path:
    folder = os.environ.get("DOCKER_CONFIG")
    return Path(folder).expanduser() / "config.json" if folder else Path.home() / ".docker" / "config.json"


def _load_config() -> dict[str, Any]:
    try:
        doc = json.loads(docker_config_file().read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable Docker config: %s", exc)
        return {}
    return doc if isinstance(doc, dict) else {}


def _host_of(key: str) -> str:
    """Keys of `auths` are hosts or URLs (`https://index.docker.io/v1/`): reduce them to `host[:port]`."""
    host = key.split("://", 1)[-1].split("/", 1)[0].lower()
    return DOCKER_HUB if host in ("docker.io", "registry-1.docker.io", "index.docker.io") else host


def _server_url(registry: str) -> str:
    return DOCKER_HUB_SERVER_URL if registry == DOCKER_HUB else registry


def _from_auths(auths: Any, registry: str) -> Credentials | None:
    if not isinstance(auths, dict):
        return None
    for key, entry in auths.items():
        if not isinstance(key, str) or not isinstance(entry, dict) or _host_of(key) != registry:
            continue
        if isinstance(entry.get("auth"), str) and entry["auth"]:
            try:
                username, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                log.warning("ignoring a malformed auth entry in the Docker config for %s", registry)
                continue
            return Credentials(username, password)
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            return Credentials(entry["username"], entry["password"])
    return None


def _from_helper(helper: str, registry: str) -> Credentials | None:
    if not _HELPER_NAME.fullmatch(helper):
        log.warning("ignoring credential helper with an invalid name: %r", helper[:64])
        return None
    program = shutil.which(f"docker-credential-{helper}")
    if program is None:
        log.warning("credential helper docker-credential-%s is not installed", helper)
        return None
    try:
        result = subprocess.run(
            [program, "get"],
            input=_server_url(registry).encode(),
            capture_output=True,
            timeout=HELPER_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("credential helper %s failed: %s", helper, exc)
        return None
    if result.returncode != 0:  # "credentials not found in native keychain" is the usual case
        return None
    try:
        doc = json.loads(result.stdout)
        username, secret = doc["Username"], doc["Secret"]
    except (ValueError, KeyError, TypeError):
        log.warning("credential helper %s printed something that is not credentials", helper)
        return None
    if not isinstance(username, str) or not isinstance(secret, str) or not secret:
        return None
    return Credentials(username, secret)


def find_credentials(registry: str) -> Credentials | None:
    """Credentials for `host[:port]` as Docker would find them, or None for anonymous access (any of
    Docker Hub's names, `docker.io` or `index.docker.io`, means Docker Hub)."""
    registry = _host_of(registry)
    config = _load_config()
    helpers = config.get("credHelpers")
    if isinstance(helpers, dict):
        for key, helper in helpers.items():
            if isinstance(key, str) and isinstance(helper, str) and _host_of(key) == registry:
                return _from_helper(helper, registry)
    store = config.get("credsStore")
    if isinstance(store, str) and store:
        found = _from_helper(store, registry)
        if found is not None:
            return found
    return _from_auths(config.get("auths"), registry)
