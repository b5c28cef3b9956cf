"""Where the daemon listens, and how the CLI reaches it, as DMR's runner and CLI do: extra addresses for
containers (DMR on Docker Engine is published on the bridge gateway), the Unix socket, the TLS listener with
its self-signed certificate, the API key.

Follows: `pkg/envconfig/envconfig.go` (MODEL_RUNNER_SOCK, MODEL_RUNNER_TLS_ENABLED, _TLS_PORT, _TLS_CERT,
_TLS_KEY, _TLS_AUTO_CERT), `pkg/server/server.go` (the second, HTTPS listener), `pkg/tls/certs.go` (a CA and
a server certificate for localhost and 127.0.0.1), `cmd/cli/desktop/context.go` (MODEL_RUNNER_HOST,
MODEL_RUNNER_TLS, _TLS_SKIP_VERIFY, _TLS_CA_CERT), `cmd/cli/commands/status.go` (`status --json`).
Safer than DMR, and tested so: beyond loopback the API key is required, the socket is 0600, TLS listens on
the daemon's own address (DMR: every interface).
"""

from __future__ import annotations

import os
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conformance.dmr_daemons import cli_env, run_cli
from tests.daemon import Daemon, free_port

StartDaemon = Callable[..., Daemon]


@pytest.fixture
def start_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StartDaemon]:
    running: list[Daemon] = []

    def start(**env: str) -> Daemon:
        for name in ("MODEL_RUNNER_API_KEY", "MODEL_RUNNER_EXTRA_LISTEN", "MODEL_RUNNER_SOCK"):
            monkeypatch.delenv(name, raising=False)
        for name in [n for n in os.environ if n.startswith("MODEL_RUNNER_TLS")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        daemon = Daemon(tmp_path / "home", free_port()).start()
        running.append(daemon)
        return daemon

    yield start
    for daemon in running:
        daemon.stop()


def unix_get(path: Path, target: str) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_unix_socket_listener(start_daemon: StartDaemon, tmp_path: Path) -> None:
    path = tmp_path / "run" / "model-runner.sock"
    daemon = start_daemon(MODEL_RUNNER_SOCK=str(path))
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # only its owner (DMR's is world-writable)
    answer = unix_get(path, "/version")
    assert answer.startswith(b"HTTP/1.1 200") and b'"version"' in answer
    # the CLI reaches it too (unix:// in MODEL_RUNNER_HOST), and the TCP port still answers
    result = run_cli(cli_env(tmp_path, f"unix://{path}"), "ls", "--json")
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
    assert daemon.http("GET", "/version").status_code == 200


def test_a_stale_socket_is_replaced_and_another_file_kept(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    path.write_text("not a socket")
    env = cli_env(tmp_path, MODEL_RUNNER_PORT=str(free_port()), MODEL_RUNNER_HOME=str(tmp_path / "h"))
    result = subprocess.run(
        [sys.executable, "-m", "modelrunner", "serve", "--socket", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "not a socket" in result.stderr
    assert path.read_text() == "not a socket"


def test_tls_listener_with_its_own_certificate(start_daemon: StartDaemon, tmp_path: Path) -> None:
    tls_port = free_port()
    daemon = start_daemon(MODEL_RUNNER_TLS_ENABLED="true", MODEL_RUNNER_TLS_PORT=str(tls_port))
    certs = daemon.home / "certs"
    assert stat.S_IMODE((certs / "server.key").stat().st_mode) == 0o600
    trusted = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    verified = httpx.get(f"https://localhost:{tls_port}/version", verify=trusted, timeout=10)
    assert verified.status_code == 200
    with pytest.raises(httpx.ConnectError):  # not trusted without the CA
        httpx.get(f"https://localhost:{tls_port}/version", timeout=10)
    with pytest.raises(httpx.ConnectError):  # on the daemon's own address only
        httpx.get(f"https://127.0.0.2:{tls_port}/version", verify=False, timeout=5)

    host = f"localhost:{tls_port}"
    # DMR's CLI variables: MODEL_RUNNER_TLS adds https://; the CA or skip-verify makes it trusted
    env = cli_env(tmp_path, host, MODEL_RUNNER_TLS="true", MODEL_RUNNER_TLS_CA_CERT=str(certs / "ca.crt"))
    assert run_cli(env, "ls", "--json").stdout.strip() == "[]"
    env = cli_env(tmp_path, host, MODEL_RUNNER_TLS="true", MODEL_RUNNER_TLS_SKIP_VERIFY="true")
    assert run_cli(env, "ls", "--json").stdout.strip() == "[]"
    refused = run_cli(cli_env(tmp_path, host, MODEL_RUNNER_TLS="true"), "ls")
    assert refused.returncode == 1 and "MODEL_RUNNER_TLS_CA_CERT" in refused.stderr


def test_tls_listener_with_a_given_certificate(start_daemon: StartDaemon, tmp_path: Path) -> None:
    from modelrunner.server.tls import ensure_certificates

    cert, key = ensure_certificates(tmp_path / "mine")
    tls_port = free_port()
    daemon = start_daemon(
        MODEL_RUNNER_TLS_ENABLED="1",
        MODEL_RUNNER_TLS_PORT=str(tls_port),
        MODEL_RUNNER_TLS_CERT=str(cert),
        MODEL_RUNNER_TLS_KEY=str(key),
    )
    assert not (daemon.home / "certs").exists()
    context = ssl.create_default_context(cafile=str(tmp_path / "mine" / "ca.crt"))
    assert httpx.get(f"https://127.0.0.1:{tls_port}/version", verify=context, timeout=10).status_code == 200


def test_tls_without_a_certificate_and_no_auto_cert_refuses_to_start(tmp_path: Path) -> None:
    env = cli_env(
        tmp_path,
        MODEL_RUNNER_PORT=str(free_port()),
        MODEL_RUNNER_TLS_ENABLED="true",
        MODEL_RUNNER_TLS_AUTO_CERT="false",
    )
    result = subprocess.run(
        [sys.executable, "-m", "modelrunner", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "MODEL_RUNNER_TLS_CERT" in result.stderr


def test_extra_listen_address(start_daemon: StartDaemon, tmp_path: Path) -> None:
    """An extra address (here a second loopback one, as tests stay on loopback) answers like the main one;
    requests to it by its address pass the Host check."""
    daemon = start_daemon(MODEL_RUNNER_EXTRA_LISTEN="127.0.0.2")
    assert httpx.get(f"http://127.0.0.2:{daemon.port}/version", timeout=10).status_code == 200
    info = daemon.http("GET", "/engines/info").json()
    assert info["extra_listen"] == [f"127.0.0.2:{daemon.port}"]
    other_port = free_port()
    second = subprocess.Popen(
        [sys.executable, "-m", "modelrunner", "serve", "--listen", f"127.0.0.3:{other_port}"],
        env={**daemon.env, "MODEL_RUNNER_PORT": str(free_port()), "MODEL_RUNNER_HOME": str(tmp_path / "h2")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        seen = None
        deadline = time.monotonic() + 30  # a start on a loaded machine, as tests/daemon.py allows it
        while time.monotonic() < deadline:
            try:
                seen = httpx.get(f"http://127.0.0.3:{other_port}/version", timeout=1).status_code
                break
            except httpx.TransportError:
                if second.poll() is not None:
                    break
                time.sleep(0.05)
        assert seen == 200
    finally:
        second.terminate()
        second.wait(15)


@pytest.mark.parametrize(
    "how",
    [
        ["serve", "--listen", "0.0.0.0"],
        ["serve", "--listen", "192.0.2.1:9000"],
        ["serve", "--host", "0.0.0.0"],
    ],
)
def test_beyond_loopback_needs_the_api_key(tmp_path: Path, how: list[str]) -> None:
    env = cli_env(tmp_path, MODEL_RUNNER_PORT=str(free_port()))
    result = subprocess.run(
        [sys.executable, "-m", "modelrunner", *how], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "without an API key" in result.stderr


def test_bad_listen_addresses_are_refused(tmp_path: Path) -> None:
    for bad in ("127.0.0.2:notaport", "127.0.0.2:70000", "[::1"):
        env = cli_env(tmp_path, MODEL_RUNNER_PORT=str(free_port()))
        result = subprocess.run(
            [sys.executable, "-m", "modelrunner", "serve", "--listen", bad],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0 and "invalid listen address" in result.stderr, bad


def test_the_cli_sends_the_api_key_and_says_when_it_is_missing_or_wrong(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """Issue 12: the CLI sent no key, read the 401 as "no daemon" and started a second one."""
    daemon = start_daemon(MODEL_RUNNER_API_KEY="s3cret")
    local = {"MODEL_RUNNER_PORT": str(daemon.port), "MODEL_RUNNER_HOME": str(daemon.home)}
    missing = run_cli(cli_env(tmp_path, **local), "ls")
    assert missing.returncode == 1
    assert "requires an API key: set MODEL_RUNNER_API_KEY" in missing.stderr
    assert "Starting the model runner" not in missing.stderr
    wrong = run_cli(cli_env(tmp_path, MODEL_RUNNER_API_KEY="nope", **local), "ls")
    assert wrong.returncode == 1 and "refused the API key" in wrong.stderr
    right = run_cli(cli_env(tmp_path, MODEL_RUNNER_API_KEY="s3cret", **local), "ls", "--json")
    assert right.returncode == 0 and right.stdout.strip() == "[]"
    status = run_cli(cli_env(tmp_path, **local), "status")
    assert status.returncode == 1 and "requires an API key" in status.stderr
    # a context may carry the key (an extra field DMR's reader skips)
    env = cli_env(tmp_path, MODEL_RUNNER_HOME=str(daemon.home))
    created = run_cli(env, "context", "create", "keyed", "--host", daemon.url, "--api-key", "s3cret")
    assert created.returncode == 0, created.stderr
    assert run_cli(env, "context", "use", "keyed").returncode == 0
    assert run_cli(env, "ls", "--json").stdout.strip() == "[]"
    assert "s3cret" not in run_cli(env, "context", "inspect", "keyed").stdout
