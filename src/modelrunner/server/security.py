"""Security defaults of the daemon, as raw ASGI middleware in front of every route.

* DNS rebinding: a request whose Host is not a local name (or one listed in MODEL_RUNNER_ALLOWED_HOSTS)
  is refused, so a web page cannot reach the daemon through a name it controls; an HTTP/1.1 request
  without a Host (or with two) is malformed (RFC 9112, 3.2): 400.
* CORS: browsers may call only from local origins or those in MODEL_RUNNER_ORIGINS (`*` = any), and a page
  of this daemon (the dashboard) from its own origin.
* An optional API key (MODEL_RUNNER_API_KEY), as `Authorization: Bearer` or `x-api-key`; the daemon refuses
  to listen beyond loopback without one.
* Request bodies are bounded (10 MiB), except model archives streamed to /models/load: by the declared
  Content-Length, and by counting the bytes as they arrive (a chunked body declares none). A refused body
  is read and dropped for a moment before the connection closes, so that the client reads the 413 rather
  than a connection reset.

Refusals are in the shape of the API the request came to (server/errors.py).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from starlette.exceptions import HTTPException

from modelrunner.server import lifecycle
from modelrunner.server.errors import error_payload
from modelrunner.server.handed_over import ABSOLUTE_FORM
from modelrunner.server.proxy import App, Message, Receive, Scope, Send, json_bytes, send_json
from modelrunner.server.routes import DMR, api_family

MAX_BODY = 10 * 1024 * 1024
UNBOUNDED_BODY_PATHS = ("/models/load", "/api/blobs/")  # model archives and files, streamed to disk
OPEN_PATHS = ("/",)  # liveness probes work without the key
# The dashboard's page and assets hold no data (its own JSON routes, /dashboard/api/, need the key): a browser
# cannot send a bearer token when it loads a page or a script.
PUBLIC_PATHS = ("/dashboard", "/dashboard/")
PUBLIC_PREFIX = "/dashboard/assets/"
DRAIN_BYTES = 64 * 1024 * 1024  # of a refused body, read and dropped before closing
DRAIN_SECONDS = 2.0
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "host.docker.internal", "model-runner.docker.internal"}
_LOCAL_ORIGIN = re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\]|0\.0\.0\.0)(:\d+)?")
_TOO_LARGE = f"the request body is larger than {MAX_BODY // (1024 * 1024)} MiB"


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a body passes the limit; answered with a 413 in the API's shape."""

    def __init__(self) -> None:
        super().__init__(413, _TOO_LARGE, headers={"Connection": "close"})


def _split_env(name: str) -> set[str]:
    return {item.strip().lower() for item in os.environ.get(name, "").split(",") if item.strip()}


@dataclass
class SecurityPolicy:
    allowed_hosts: set[str] = field(default_factory=set)
    check_host: bool = True
    origins: set[str] = field(default_factory=set)
    api_key: str | None = None

    @classmethod
    def from_env(cls, bind_host: str, extra_hosts: Sequence[str] = ()) -> SecurityPolicy:
        from modelrunner.config import is_loopback_host

        allowed = _split_env("MODEL_RUNNER_ALLOWED_HOSTS")
        # Beyond loopback the API key is what protects; names are then too many to list. Extra listen
        # addresses (a bridge gateway) are reached by their address, so they join the allowed names.
        check_host = is_loopback_host(bind_host) or bool(allowed)
        return cls(
            allowed_hosts=allowed | {bind_host.lower()} | {host.lower() for host in extra_hosts},
            check_host=check_host,
            origins=_split_env("MODEL_RUNNER_ORIGINS") | _split_env("DMR_ORIGINS"),
            api_key=os.environ.get("MODEL_RUNNER_API_KEY") or None,
        )

    def host_allowed(self, host_header: str | None) -> bool:
        if not self.check_host or host_header is None:
            return True
        host = host_header.strip().lower()
        if host.startswith("["):  # [v6 address], then an optional port
            end = host.find("]")
            host, rest = (host[1:end], host[end + 1 :]) if end > 0 else (host, "")
        elif host.count(":") == 1:  # name:port (an unbracketed v6 address has more colons)
            host, rest = host.split(":")
            rest = ":" + rest
        else:
            rest = ""
        # what follows the host must be a port (1-65535) and nothing else: "127.0.0.1:80@evil.example" and
        # "localhost:99999" are refused
        port = rest[1:]
        if rest and not (rest[0] == ":" and port.isdigit() and port.isascii() and 0 < int(port[:6]) <= 65535):
            return False
        return host in _LOCAL_HOSTS or host in self.allowed_hosts

    def origin_allowed(self, origin: str) -> bool:
        origin = origin.lower().rstrip("/")
        return "*" in self.origins or origin in self.origins or bool(_LOCAL_ORIGIN.fullmatch(origin))

    def same_origin(self, origin: str, scheme: str, host_header: str | None) -> bool:
        """A page served by this daemon calling it back (browsers send Origin on same-origin POSTs): its
        origin is the scheme and Host of the request itself, a Host the host check has already admitted."""
        return host_header is not None and origin.lower().rstrip("/") == f"{scheme}://{host_header.lower()}"

    def key_valid(self, headers: dict[bytes, bytes]) -> bool:
        if self.api_key is None:
            return True
        expected = self.api_key.encode()
        bearer = headers.get(b"authorization", b"")
        candidates = [headers.get(b"x-api-key", b"")]
        if bearer[:7].lower() == b"bearer ":
            candidates.append(bearer[7:].strip())
        return any(hmac.compare_digest(c, expected) for c in candidates if c)


async def drain(receive: Receive, limit: int = DRAIN_BYTES, seconds: float = DRAIN_SECONDS) -> bool:
    """Read and drop the rest of a refused request body, within bounds; True if it was all read."""
    read = 0
    try:
        async with asyncio.timeout(seconds):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return False
                read += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
                if read > limit:
                    return False
    except TimeoutError:
        return False


class SecurityMiddleware:
    def __init__(self, app: App, policy: SecurityPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        family = api_family(scope["path"])

        async def refuse(status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
            await send_json(send, status, error_payload(family, status, message), extra)

        if scope.get(ABSOLUTE_FORM):  # the target named a host: this daemon is no proxy (RFC 9112 3.2.2)
            await refuse(400, "the request target must be a path, not a URL: this server is not a proxy")
            return
        raw_headers = [(bytes(k).lower(), bytes(v)) for k, v in scope["headers"]]
        headers = dict(raw_headers)
        hosts = [v for k, v in raw_headers if k == b"host"]
        if scope.get("http_version") == "1.1" and (len(hosts) != 1 or not hosts[0].strip()):
            await refuse(
                400, "an HTTP/1.1 request needs exactly one Host header", [(b"connection", b"close")]
            )
            return
        if not self.policy.host_allowed(hosts[0].decode("latin-1") if hosts else None):
            await refuse(403, "this host name is not allowed; add it to MODEL_RUNNER_ALLOWED_HOSTS")
            return
        origin = headers.get(b"origin", b"").decode("latin-1")
        cors: list[tuple[bytes, bytes]] = []
        if origin:
            request_host = hosts[0].decode("latin-1") if hosts else None
            if not (
                self.policy.origin_allowed(origin)
                or self.policy.same_origin(origin, scope.get("scheme", "http"), request_host)
            ):
                await refuse(403, "this origin is not allowed; add it to MODEL_RUNNER_ORIGINS")
                return
            cors = [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
            if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                requested = headers.get(b"access-control-request-headers", b"*")
                preflight = [
                    *cors,
                    (b"access-control-allow-credentials", b"true"),  # as DMR's CorsMiddleware
                    (b"access-control-allow-methods", b"GET, HEAD, POST, DELETE, OPTIONS"),
                    (b"access-control-allow-headers", requested),
                    (b"access-control-max-age", b"600"),
                ]
                await send({"type": "http.response.start", "status": 204, "headers": preflight})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
        path = scope["path"]
        public = path in OPEN_PATHS or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIX)
        if not public and not self.policy.key_valid(headers):
            await refuse(401, "missing or wrong API key", [(b"www-authenticate", b"Bearer")])
            return
        if cors:
            send = _with_headers(send, cors)
        if scope["path"].startswith(UNBOUNDED_BODY_PATHS):
            await self.app(scope, receive, send)
            return
        length = headers.get(b"content-length")
        if length and length.isdigit() and int(length) > MAX_BODY:
            await self._refuse_declared(send, receive, family, headers.get(b"expect", b"").lower())
            return
        await self.app(scope, _bounded(receive, family != DMR and scope["method"] == "POST"), send)

    async def _refuse_declared(self, send: Send, receive: Receive, family: str, expect: bytes) -> None:
        """A body declared too large: the 413 goes out first, then (unless the client waits for a
        `100 Continue` before sending) the body is read and dropped for a moment, then the connection
        closes."""
        body = json_bytes(error_payload(family, 413, _TOO_LARGE))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": True})
        if expect != b"100-continue":
            await drain(receive)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _bounded(receive: Receive, keep: bool) -> Receive:
    """`receive`, counting the body's bytes as they arrive: past the limit the rest is drained and
    BodyTooLarge raised. With `keep`, the start of the body is kept for the request recorder."""
    received = 0
    exchange = lifecycle.current_or_none() if keep else None

    async def bounded() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > MAX_BODY:
                if message.get("more_body", False):
                    await drain(receive)
                raise BodyTooLarge()
            if exchange is not None and chunk:
                exchange.keep_request(chunk)
        return message

    return bounded


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return send_with_headers
