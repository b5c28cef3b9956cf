"""Settings read from the environment, with DMR's variable names where DMR has one.

Every CLI command reads this module (client_target), so it stays cheap to import: named tuples rather than
dataclasses (importing dataclasses costs ~9 ms, most of `model ls`'s budget), platformdirs only when asked.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import NamedTuple

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


def env_seconds(name: str, default: float) -> float:
    """Seconds from environment variable `name` (0 allowed), `default` when unset; ValueError otherwise."""
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be 0 or a number of seconds, got {raw!r}")
    return value


def _flag(name: str, default: bool = False) -> bool:
    """A boolean environment variable as Go's strconv.ParseBool reads DMR's ones."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("1", "t", "true", "yes", "on"):
        return True
    if raw in ("0", "f", "false", "no", "off"):
        return False
    return default


LOG_STDERR = "MODEL_RUNNER_LOG_STDERR"


def log_to_stderr() -> bool:
    """Whether the daemon writes its log lines to stderr as well as to logs/daemon.log
    (`MODEL_RUNNER_LOG_STDERR`, on by default). A daemon the CLI starts in the background has it off: its
    stderr goes to a file (logs/daemon.stdout.log) that would hold every line a second time, never rotated."""
    return _flag(LOG_STDERR, default=True)


class ListenAddress(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def is_loopback_host(host: str) -> bool:
    """Whether a host name or address given to listen on or to connect to is this machine's loopback."""
    import ipaddress  # not for every CLI start: only the verbs that check an address

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_listen_address(text: str, default_port: int) -> ListenAddress:
    """`HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT` (e.g. a Docker bridge gateway, 172.17.0.1)."""
    text = text.strip()
    host, port = text, default_port
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (text[end + 1 :] and not text[end + 1 :].startswith(":")):
            raise ValueError(f"invalid listen address {text!r}")
        host, rest = text[1:end], text[end + 2 :]
        if rest:
            port = int(rest) if rest.isdigit() else -1
    elif text.count(":") == 1:
        host, rest = text.split(":")
        port = int(rest) if rest.isdigit() else -1
    if not host or not 0 < port < 65536:
        raise ValueError(f"invalid listen address {text!r}: use HOST or HOST:PORT")
    return ListenAddress(host, port)


def extra_listen_addresses(default_port: int) -> list[ListenAddress]:
    """`MODEL_RUNNER_EXTRA_LISTEN`: more addresses the daemon listens on besides its main one, comma
    separated (for containers: the Docker bridge gateway, which is how DMR is reached from them)."""
    raw = os.environ.get("MODEL_RUNNER_EXTRA_LISTEN", "")
    return [parse_listen_address(item, default_port) for item in raw.split(",") if item.strip()]


class TLSSettings(NamedTuple):
    """DMR's second, HTTPS listener (`pkg/envconfig`): MODEL_RUNNER_TLS_ENABLED, _TLS_PORT (12444),
    _TLS_CERT and _TLS_KEY, or a certificate made here when _TLS_AUTO_CERT is true (the default)."""

    enabled: bool
    port: int
    cert: Path | None
    key: Path | None
    auto_cert: bool


DEFAULT_TLS_PORT = 12444


def tls_settings() -> TLSSettings:
    raw_port = os.environ.get("MODEL_RUNNER_TLS_PORT") or str(DEFAULT_TLS_PORT)
    if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
        raise ValueError(f"MODEL_RUNNER_TLS_PORT must be a port number, got {raw_port!r}")
    cert, key = os.environ.get("MODEL_RUNNER_TLS_CERT"), os.environ.get("MODEL_RUNNER_TLS_KEY")
    return TLSSettings(
        enabled=_flag("MODEL_RUNNER_TLS_ENABLED"),
        port=int(raw_port),
        cert=Path(cert).expanduser() if cert else None,
        key=Path(key).expanduser() if key else None,
        auto_cert=_flag("MODEL_RUNNER_TLS_AUTO_CERT", default=True),
    )


def unix_socket_path() -> Path | None:
    """`MODEL_RUNNER_SOCK`: a Unix socket the daemon listens on as well (only its owner may connect)."""
    raw = os.environ.get("MODEL_RUNNER_SOCK")
    return Path(raw).expanduser() if raw else None


def default_registry() -> str:
    return os.environ.get("DEFAULT_REGISTRY") or "index.docker.io"


class ClientTarget(NamedTuple):
    """Where the CLI finds the daemon, how it talks to it, and whether it may start one itself."""

    base_url: str
    explicit: bool  # MODEL_RUNNER_HOST or a named context: never auto-start a local daemon
    api_key: str | None = None
    tls_skip_verify: bool = False
    tls_ca_cert: str | None = None
    context: str | None = None  # the named context in use, if any


def client_target() -> ClientTarget:
    """As DMR's CLI finds its runner (`cmd/cli/desktop/context.go: DetectContext`): MODEL_RUNNER_HOST, else
    the active named context, else the local daemon; MODEL_RUNNER_TLS, _TLS_SKIP_VERIFY and _TLS_CA_CERT
    override the context's TLS settings field by field. MODEL_RUNNER_API_KEY, else the context's key."""
    from modelrunner.contexts import DEFAULT_CONTEXT, ContextStore

    host = os.environ.get("MODEL_RUNNER_HOST") or ""
    tls = os.environ.get("MODEL_RUNNER_TLS")
    skip = os.environ.get("MODEL_RUNNER_TLS_SKIP_VERIFY")
    ca_cert = os.environ.get("MODEL_RUNNER_TLS_CA_CERT")
    use_tls, skip_verify = tls == "true", skip == "true"
    api_key = os.environ.get("MODEL_RUNNER_API_KEY") or None
    context = None
    if not host:
        store = ContextStore()
        active = store.active()
        if active != DEFAULT_CONTEXT:
            named = store.get(active)
            host, context = named.host, active
            use_tls = use_tls if tls is not None else named.tls
            skip_verify = skip_verify if skip is not None else named.tls_skip_verify
            ca_cert = ca_cert if ca_cert is not None else (named.tls_ca_cert or None)
            api_key = api_key or named.api_key
    if host:
        if "://" not in host:
            host = ("https://" if use_tls else "http://") + host
        elif use_tls and host.startswith("http://"):
            host = "https://" + host.removeprefix("http://")
        return ClientTarget(host.rstrip("/"), True, api_key, skip_verify, ca_cert or None, context)
    if use_tls:
        port = os.environ.get("MODEL_RUNNER_TLS_PORT") or str(DEFAULT_TLS_PORT)
        return ClientTarget(f"https://localhost:{port}", False, api_key, skip_verify, ca_cert or None)
    return ClientTarget(
        f"http://{DEFAULT_HOST}:{daemon_port()}", False, api_key, skip_verify, ca_cert or None
    )
