"""Real OCI registries for tests: Debian's `docker-registry` with no auth, htpasswd, or token auth.

Also a local token service (RS256 JWTs with the certificate in `x5c`, as distribution verifies them) and a
`RegistryProxy` in front of a registry that counts blob bytes and can misbehave on request: hold a blob
midway, ignore `Range`, answer 503, redirect blobs elsewhere, or serve a hostile manifest.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import bcrypt
import httpx
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.daemon import free_port
from tests.referrers import Referrers

REGISTRY_BINARY = "docker-registry"
SERVICE = "modelrunner-test"
ISSUER = "modelrunner-test-issuer"
USERS = {"alice": "wonderland"}


def require_tool(binary: str, package: str) -> None:
    """The test command never skips for a missing tool: it fails, naming it (`scripts/test` installs them)."""
    if shutil.which(binary) is None:
        pytest.fail(
            f"{binary} is missing: apt-get install {package} (scripts/test installs what the tests need)",
            pytrace=False,
        )


# --- token service -----------------------------------------------------------------------------------------


@dataclass
class TokenRequest:
    authorization: bool  # whether credentials were sent
    username: str | None
    scopes: list[str]


class TokenServer:
    """GET /token: Basic-authenticated users get what they ask for; anonymous users get pull on `public/*`;
    a wrong password is a 401. Every request is recorded."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port()
        self.requests: list[TokenRequest] = []
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "modelrunner test token signer")])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self._server: ThreadingHTTPServer | None = None

    @property
    def realm(self) -> str:
        return f"http://{self.host}:{self.port}/token"

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def grant(self, username: str | None, scope: str) -> dict[str, Any] | None:
        kind, _, rest = scope.partition(":")
        name, _, actions = rest.rpartition(":")
        if kind != "repository" or not name:
            return None
        wanted = [a for a in actions.split(",") if a]
        allowed = wanted if username else [a for a in wanted if a == "pull" and name.startswith("public/")]
        return {"type": "repository", "name": name, "actions": allowed}

    def token(self, username: str | None, scopes: list[str]) -> str:
        now = int(time.time())
        access = [g for g in (self.grant(username, s) for s in scopes) if g is not None]
        claims = {
            "iss": ISSUER,
            "sub": username or "",
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        der = self.cert.public_bytes(serialization.Encoding.DER)
        headers = {"x5c": [base64.b64encode(der).decode()]}
        return jwt.encode(claims, self.key, algorithm="RS256", headers=headers)

    def start(self) -> TokenServer:
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                header = self.headers.get("Authorization")
                username = None
                if header and header.startswith("Basic "):
                    user, _, password = base64.b64decode(header[6:]).decode().partition(":")
                    if USERS.get(user) != password:
                        server_self.requests.append(TokenRequest(True, user, query.get("scope", [])))
                        self.send_response(401)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    username = user
                server_self.requests.append(
                    TokenRequest(header is not None, username, query.get("scope", []))
                )
                body = json.dumps({"token": server_self.token(username, query.get("scope", []))}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


# --- the registry ------------------------------------------------------------------------------------------


@dataclass
class Registry:
    """`docker-registry serve` on 127.0.0.1; `auth` is "none", "htpasswd" or "token"."""

    workdir: Path
    auth: str = "none"
    token_host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    token_server: TokenServer | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def storage(self) -> Path:
        return self.workdir / "storage"

    def blob_data_path(self, digest: str) -> Path:
        hex_ = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hex_[:2] / hex_ / "data"

    def _config(self) -> str:
        lines = [
            "version: 0.1",
            "log:",
            "  level: info",
            "  accesslog:",
            "    disabled: false",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {self.storage}",
            "  delete:",
            "    enabled: true",
            "http:",
            f"  addr: 127.0.0.1:{self.port}",
        ]
        if self.auth == "htpasswd":
            htpasswd = self.workdir / "htpasswd"
            htpasswd.write_text(
                "".join(
                    f"{user}:{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=5)).decode()}\n"
                    for user, pw in USERS.items()
                )
            )
            lines += ["auth:", "  htpasswd:", "    realm: modelrunner-test", f"    path: {htpasswd}"]
        elif self.auth == "token":
            self.token_server = TokenServer(self.token_host).start()
            bundle = self.workdir / "token-cert.pem"
            bundle.write_bytes(self.token_server.cert_pem())
            lines += [
                "auth:",
                "  token:",
                f"    realm: {self.token_server.realm}",
                f"    service: {SERVICE}",
                f"    issuer: {ISSUER}",
                f"    rootcertbundle: {bundle}",
            ]
        return "\n".join(lines) + "\n"

    def start(self) -> Registry:
        require_tool(REGISTRY_BINARY, "docker-registry")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.yml"
        config.write_text(self._config())
        log = open(self.workdir / "registry.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen([REGISTRY_BINARY, "serve", str(config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/v2/", timeout=1)
                return self
            except httpx.TransportError:
                if self.process.poll() is not None:
                    raise RuntimeError((self.workdir / "registry.log").read_text()) from None
                time.sleep(0.05)
        raise RuntimeError("docker-registry did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        if self.token_server is not None:
            self.token_server.stop()

    def auth_for(self, scope: str) -> dict[str, str]:
        """Headers that let a test talk to this registry as alice."""
        if self.auth == "htpasswd":
            return {"Authorization": "Basic " + base64.b64encode(b"alice:wonderland").decode()}
        if self.auth == "token":
            assert self.token_server is not None
            return {"Authorization": "Bearer " + self.token_server.token("alice", [scope])}
        return {}


def docker_config(folder: Path, registry: str, username: str, password: str) -> Path:
    """A DOCKER_CONFIG folder whose config.json holds inline credentials for `registry`."""
    folder.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    return folder


# --- a misbehaving proxy -----------------------------------------------------------------------------------


@dataclass
class ProxyControls:
    hold_after: int | None = None  # blob GETs: stop after this many body bytes until `release` is set
    cut_after: int | None = None  # once, in the first blob GET that is longer: close after this many bytes
    release: threading.Event = field(default_factory=threading.Event)
    ignore_range: bool = False
    fail_blob_gets: list[int] = field(default_factory=list)  # statuses for the next blob GETs
    redirect_blobs_to: str | None = None
    manifests: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # path -> (body, content type)
    on_blob_get: Callable[[], None] | None = None
    # OCI 1.1's referrers API, which Debian's docker-registry lacks: answered from the manifests with a
    # `subject` that were pushed through the proxy (tests/referrers.py)
    serve_referrers: bool = False


class RegistryProxy:
    """Forwards to a registry, counting the blob bytes it sends and the Range headers it sees."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream  # host:port
        self.port = free_port()
        self.controls = ProxyControls()
        self.blob_bytes = 0
        self.ranges: list[str | None] = []
        self.request_headers: list[dict[str, str]] = []
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        self.referrers = Referrers()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset_counts(self) -> None:
        with self._lock:
            self.blob_bytes = 0
            self.ranges.clear()

    def start(self) -> RegistryProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _reply(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self) -> None:
                proxy.request_headers.append(dict(self.headers.items()))
                proxy.requests.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = urlsplit(self.path).path
                controls = proxy.controls
                is_blob_get = self.command == "GET" and "/blobs/sha256:" in path
                if self.command == "GET" and path in controls.manifests:
                    data, content_type = controls.manifests[path]
                    self._reply(200, {"Content-Type": content_type}, data)
                    return
                if controls.serve_referrers and (answer := proxy.referrers.answer(self.command, self.path)):
                    self._reply(*answer)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                if is_blob_get:
                    with proxy._lock:
                        proxy.ranges.append(self.headers.get("Range"))
                    if controls.on_blob_get is not None:
                        controls.on_blob_get()
                    if controls.fail_blob_gets:
                        self._reply(controls.fail_blob_gets.pop(0), {})
                        return
                    if controls.redirect_blobs_to is not None:
                        self._reply(307, {"Location": controls.redirect_blobs_to + path})
                        return
                    if controls.ignore_range:
                        headers.pop("Range", None)
                        headers.pop("range", None)
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    upstream = conn.getresponse()
                    if self.command == "HEAD":
                        self.send_response(upstream.status)
                        for key, value in upstream.getheaders():
                            if key.lower() not in _HOP or key.lower() == "content-length":
                                self.send_header(key, value)
                        self.end_headers()
                        return
                    if not is_blob_get or upstream.status >= 300:
                        data = upstream.read()
                        if controls.serve_referrers and upstream.status == 201:
                            proxy.referrers.saw_put(self.command, path, body)
                        out = {k: v for k, v in upstream.getheaders() if k.lower() not in _HOP}
                        self._reply(upstream.status, out, data)
                        return
                    self.send_response(upstream.status)
                    for key, value in upstream.getheaders():
                        if key.lower() not in _HOP or key.lower() == "content-length":
                            self.send_header(key, value)
                    self.end_headers()
                    sent = 0
                    while chunk := upstream.read(64 * 1024):
                        cut = controls.cut_after
                        if cut is not None and sent + len(chunk) >= cut:
                            controls.cut_after = None
                            with proxy._lock:
                                proxy.blob_bytes += cut - sent
                            self.wfile.write(chunk[: cut - sent])
                            self.wfile.flush()
                            self.close_connection = True
                            return
                        hold = controls.hold_after
                        if hold is not None and sent + len(chunk) > hold:
                            chunk = chunk[: max(0, hold - sent)]
                            with proxy._lock:
                                proxy.blob_bytes += len(chunk)
                            self.wfile.write(chunk)
                            self.wfile.flush()
                            controls.release.wait()
                            self.close_connection = True
                            return
                        with proxy._lock:  # counted first: the pull may end before this thread runs again
                            proxy.blob_bytes += len(chunk)
                        self.wfile.write(chunk)
                        sent += len(chunk)
                finally:
                    conn.close()

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.controls.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
