"""An OCI distribution API client on httpx: ping, auth challenges, manifests, blobs, uploads.

Auth follows the registry's `/v2/` challenge: Basic sends the Docker credentials, Bearer fetches a token per
repository scope (again, wider, when the registry answers `insufficient_scope`). A `bearer-token` given with
the request replaces all of that, as in DMR. Stored credentials go to a token realm only when it is the
registry's own host, or an HTTPS host of the same domain (Docker Hub's auth.docker.io) (CVE-2025-51471).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import logging
import os
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import urljoin, urlsplit

import httpx

from modelrunner import __version__
from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.manifest import MAX_MANIFEST_BYTES
from modelrunner.distribution import netpolicy
from modelrunner.distribution.challenge import Challenge, parse_challenge
from modelrunner.distribution.credentials import Credentials, find_credentials
from modelrunner.distribution.errors import (
    RegistryForbidden,
    RegistryUnauthorized,
    RegistryUnavailable,
    TransferCancelled,
    unreachable,
)
from modelrunner.errors import InvalidArtifact, ModelNotFound
from modelrunner.reference import DOCKER_HUB

log = logging.getLogger(__name__)

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
# The registry answers 404 to a manifest GET without Accept (dependencies.md), so always send one.
MANIFEST_ACCEPT = ", ".join([mt.OCI_MANIFEST, mt.DOCKER_MANIFEST_V2, OCI_INDEX, DOCKER_MANIFEST_LIST])

RETRY_STATUSES = frozenset({502, 503, 504})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_ATTEMPTS = 5
MAX_REDIRECTS = 5
USER_AGENT = f"modelrunner/{__version__}"
CONNECT_TIMEOUT = 30.0
# The most a blob body read takes from the socket at once (each read hands over what has arrived).
BLOB_READ_SIZE = 1024 * 1024


def stall_timeout() -> float:
    """Seconds without a byte before a transfer counts as stalled and is retried from where it stopped."""
    try:
        return max(0.1, float(os.environ.get("MODEL_RUNNER_STALL_TIMEOUT", "60")))
    except ValueError:
        return 60.0


def cancellable_sleep(seconds: float, cancelled: Callable[[], bool]) -> None:
    """Sleep, waking early on cancellation (TransferCancelled)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cancelled():
            raise TransferCancelled("the transfer was cancelled")
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def backoff_seconds(attempt: int) -> float:
    """0.25, 0.5, 1, 2 s... capped at 8 s."""
    return float(min(8.0, 0.25 * 2**attempt))


def api_host(registry: str) -> str:
    return "registry-1.docker.io" if registry == DOCKER_HUB else registry


def pull_scope(repository: str) -> str:
    return f"repository:{repository}:pull"


def push_scope(repository: str) -> str:
    return f"repository:{repository}:pull,push"


@dataclass(frozen=True)
class Mirror:
    registry: str
    base_url: str


def configured_mirrors(registry: str) -> list[str]:
    """Base URLs from MODEL_RUNNER_REGISTRY_MIRRORS (`registry=url,registry=url`), in order, for pulls."""
    mirrors = []
    for item in os.environ.get("MODEL_RUNNER_REGISTRY_MIRRORS", "").split(","):
        name, sep, url = item.strip().partition("=")
        if sep and name.strip().lower() in (registry, "*") and url.strip():
            mirrors.append(url.strip().rstrip("/"))
    return mirrors


def _same_site(a: str, b: str) -> bool:
    return a.split(".")[-2:] == b.split(".")[-2:] and a.count(".") >= 1 and b.count(".") >= 1


@functools.cache
def _tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    return httpx.create_ssl_context()  # honours SSL_CERT_FILE / SSL_CERT_DIR, else certifi's bundle


def tls_context() -> ssl.SSLContext:
    """One TLS context per process (and CA setting), shared by every client: building one loads the CA
    bundle, 55-90 ms here, which every pull, push and remote inspect paid before."""
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


def proxy_configured(url: str) -> bool:
    """Whether the environment names a proxy for `url`'s scheme (HTTP(S)_PROXY, ALL_PROXY); httpx then
    decides, NO_PROXY included, as for every other request."""
    proxies = urllib.request.getproxies_environment()
    return bool(proxies.get(urlsplit(url).scheme) or proxies.get("all"))


class _Answer(Protocol):
    """What the auth round needs of a response: httpx's, or a blob's (BlobResponse)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Any: ...

    def close(self) -> None: ...


AnswerT = TypeVar("AnswerT", bound=_Answer)


class BlobResponse:
    """The answer to a blob GET: status and headers, and the body as chunks (`chunks()`).

    Connected directly, the body is read with http.client, each read straight from the socket into the
    chunk it returns: httpx's HTTP/1.1 parser (h11) copies every byte four times on its way in, in 64 KiB
    reads, which cost 0.6 CPU seconds per GiB here against 0.23 for this (bench/RESULTS.md, pull). Through
    a proxy from the environment, httpx streams it as before. Either way a cut before the end raises a
    transport error (RegistryUnavailable or httpx.TransportError): the store keeps what arrived for the
    resume.
    """

    def __init__(
        self,
        status_code: int,
        headers: Any,
        url: str,
        chunks: Callable[[], Iterator[bytes]],
        close: Callable[[], None],
    ) -> None:
        self.status_code = status_code
        self.headers = headers  # .get(name) is case-insensitive for both kinds
        self.url = url
        self._chunks = chunks
        self._close = close

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives."""
        return self._chunks()

    def close(self) -> None:
        self._close()

    @classmethod
    def from_httpx(cls, response: httpx.Response) -> BlobResponse:
        return cls(
            response.status_code, response.headers, str(response.url), response.iter_bytes, response.close
        )

    @classmethod
    def get_direct(cls, url: str, headers: dict[str, str], read_timeout: float) -> BlobResponse:
        """GET `url` on a connection of its own (closed with the response)."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            connection = http.client.HTTPSConnection(
                host, parts.port, timeout=CONNECT_TIMEOUT, context=tls_context()
            )
        else:
            connection = http.client.HTTPConnection(host, parts.port, timeout=CONNECT_TIMEOUT)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            connection.connect()
            assert connection.sock is not None
            connection.sock.settimeout(read_timeout)
            connection.request("GET", target, headers={"User-Agent": USER_AGENT, **headers})
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise unreachable(f"the registry {parts.netloc}", exc) from None

        def chunks() -> Iterator[bytes]:
            received = 0
            try:  # read1: what has arrived, at most BLOB_READ_SIZE, so that it reaches the disk at once
                while chunk := response.read1(BLOB_READ_SIZE):
                    received += len(chunk)
                    yield chunk
            except (OSError, http.client.HTTPException) as exc:
                raise RegistryUnavailable(f"{parts.netloc} stopped sending: {describe(exc)}") from None
            if response.length:  # http.client takes a close before the announced length for the end
                raise RegistryUnavailable(f"{parts.netloc} closed the connection after {received} bytes")

        return cls(response.status, response.headers, url, chunks, connection.close)


class RegistryClient:
    """One registry (or one mirror of it), shared by the threads of one pull or push."""

    def __init__(
        self,
        registry: str,
        *,
        bearer_token: str | None = None,
        credentials: Credentials | None = None,
        base_url: str | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        self.registry = registry
        self._bearer_override = bearer_token
        self._credentials = credentials if credentials is not None else find_credentials(registry)
        self._fixed_base = base_url
        self.base_url = base_url or f"https://{api_host(registry)}"
        self.cancelled = cancelled
        self._challenge: Challenge | None = None
        self._pinged = False
        self._tokens: dict[tuple[str, ...], str] = {}
        self._extra_scopes: set[str] = set()
        self._lock = threading.Lock()
        timeout = httpx.Timeout(connect=30.0, read=stall_timeout(), write=stall_timeout(), pool=60.0)
        self.http = httpx.Client(
            timeout=timeout,
            verify=tls_context(),
            follow_redirects=False,
            headers={"User-Agent": USER_AGENT},
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=16),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- connection and auth ---------------------------------------------------------------------

    @property
    def _target_host(self) -> str:
        return urlsplit(self.base_url).netloc

    def ping(self) -> None:
        """GET /v2/: picks HTTPS or (where allowed) HTTP, and learns the auth challenge."""
        with self._lock:
            if self._pinged:
                return
            candidates = [self.base_url]
            if self._fixed_base is None and netpolicy.insecure_allowed(self.registry):
                candidates.append(f"http://{api_host(self.registry)}")
            last_error: Exception | None = None
            for base in candidates:
                url = f"{base}/v2/"
                try:
                    if base != candidates[-1]:  # HTTPS to a plain-HTTP registry: one try, then HTTP
                        response = self.http.get(url)
                    else:
                        response = self._with_retries(functools.partial(self.http.get, url))
                except httpx.TransportError as exc:
                    last_error = exc
                    continue
                except RegistryUnavailable as exc:
                    last_error = exc
                    continue
                self.base_url = base
                if response.status_code == 401:
                    self._challenge = parse_challenge(response.headers.get("www-authenticate"))
                self._pinged = True
                return
            assert last_error is not None
            raise last_error

    def _realm_trusted(self, realm: str) -> bool:
        parts = urlsplit(realm)
        realm_host = (parts.hostname or "").lower()
        registry_host = (urlsplit(self.base_url).hostname or "").lower()
        if realm_host == registry_host:
            return True
        return parts.scheme == "https" and _same_site(realm_host, registry_host)

    def _fetch_token(self, scopes: tuple[str, ...]) -> str:
        challenge = self._challenge
        assert challenge is not None and challenge.realm
        realm = challenge.realm
        netpolicy.check_target(realm, self._target_host, "token realm")
        params: list[tuple[str, str | int | float | bool | None]] = [("scope", s) for s in scopes]
        if challenge.params.get("service"):
            params.insert(0, ("service", challenge.params["service"]))
        auth = None
        if self._credentials is not None:
            if self._realm_trusted(realm):
                auth = httpx.BasicAuth(self._credentials.username, self._credentials.password)
            else:
                log.warning("not sending credentials to token realm %s: not the registry's host", realm)
        response = self._with_retries(lambda: self.http.get(realm, params=params, auth=auth))
        if response.status_code in (401, 403):
            raise self._unauthorized(sent_credentials=auth is not None)
        if response.status_code >= 400:
            raise RegistryUnavailable(
                f"token service of {self.registry} answered HTTP {response.status_code}"
            )
        try:
            doc = response.json()
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryUnavailable(f"token service of {self.registry} sent no token")
        return token

    def _unauthorized(self, sent_credentials: bool) -> RegistryUnauthorized:
        if sent_credentials:
            return RegistryUnauthorized(
                f"authentication failed for {self.registry}: the registry refused the credentials; "
                f"check them with: docker login {self.registry}"
            )
        return RegistryUnauthorized(
            f"{self.registry} requires authentication or denied access; log in with: docker login "
            f"{self.registry} (or pass a bearer token)"
        )

    def _auth_headers(self, scopes: Sequence[str]) -> dict[str, str]:
        if self._bearer_override:
            return {"Authorization": f"Bearer {self._bearer_override}"}
        challenge = self._challenge
        if challenge is None:
            return {}
        if challenge.scheme == "basic":
            if self._credentials is None:
                return {}
            basic = httpx.BasicAuth(self._credentials.username, self._credentials.password)
            return {
                "Authorization": next(basic.auth_flow(httpx.Request("GET", "/"))).headers["Authorization"]
            }
        key = tuple(sorted(set(scopes) | self._extra_scopes))
        with self._lock:
            token = self._tokens.get(key)
        if token is None:
            token = self._fetch_token(key)
            with self._lock:
                self._tokens[key] = token
        return {"Authorization": f"Bearer {token}"}

    def _with_retries(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        """Network errors and 502/503/504 are retried with backoff; the last answer or error wins."""
        for attempt in range(MAX_ATTEMPTS):
            if self.cancelled():
                raise TransferCancelled("the transfer was cancelled")
            try:
                response = send()
            except httpx.TransportError as exc:
                if attempt == MAX_ATTEMPTS - 1:
                    raise unreachable(f"the registry {self.registry}", exc) from None
                log.info("retrying after network error from %s: %s", self.registry, describe(exc))
            else:
                if response.status_code not in RETRY_STATUSES or attempt == MAX_ATTEMPTS - 1:
                    return response
                response.close()
                log.info("retrying after HTTP %s from %s", response.status_code, self.registry)
            self.sleep(backoff_seconds(attempt))
        raise AssertionError("unreachable")

    def sleep(self, seconds: float) -> None:
        cancellable_sleep(seconds, self.cancelled)

    def request(
        self,
        method: str,
        path_or_url: str,
        scopes: Sequence[str],
        *,
        headers: dict[str, str] | None = None,
        content: bytes | Iterator[bytes] | None = None,
        stream: bool = False,
        retry: bool = True,
    ) -> httpx.Response:
        """A request with auth; one re-challenge on 401 (token expired or a wider scope needed)."""
        self.ping()
        url = urljoin(self.base_url + "/", path_or_url)

        def send(auth: dict[str, str]) -> httpx.Response:
            def once() -> httpx.Response:
                request = self.http.build_request(
                    method, url, headers={**(headers or {}), **auth}, content=content
                )
                return self.http.send(request, stream=stream)

            return self._with_retries(once) if retry else once()

        return self._send_authorized(scopes, send)

    def _send_authorized(self, scopes: Sequence[str], send: Callable[[dict[str, str]], AnswerT]) -> AnswerT:
        """`send(auth_headers)`, again after a 401 that names a realm or scope to (re)authenticate with."""
        for round_ in range(2):
            response = send(self._auth_headers(scopes))
            if response.status_code != 401:
                return response
            response.close()
            challenge = parse_challenge(response.headers.get("www-authenticate"))
            if self._bearer_override or round_ == 1 or challenge is None:
                raise self._unauthorized(sent_credentials=self._credentials is not None)
            if challenge.scheme == "basic" and (self._challenge is None or self._credentials is None):
                self._challenge = challenge
                if self._credentials is None:
                    raise self._unauthorized(sent_credentials=False)
                continue
            if challenge.scheme == "basic":
                raise self._unauthorized(sent_credentials=True)
            # Bearer: remember the realm, add the scope the registry asked for, drop stale tokens.
            self._challenge = challenge
            if challenge.params.get("scope"):
                self._extra_scopes.update(challenge.params["scope"].split(" "))
            with self._lock:
                self._tokens.clear()
        raise AssertionError("unreachable")

    # -- the API ---------------------------------------------------------------------------------

    def get_manifest(self, repository: str, reference: str) -> tuple[bytes, str]:
        """Raw manifest bytes (capped) and their media type."""
        response = self.request(
            "GET",
            f"/v2/{repository}/manifests/{reference}",
            [pull_scope(repository)],
            headers={"Accept": MANIFEST_ACCEPT},
            stream=True,
        )
        with contextlib.closing(response):
            raise_for_status(response, f"{self.registry}/{repository}:{reference}")
            data = read_capped(response.iter_bytes(), MAX_MANIFEST_BYTES, "manifest")
        media_type = response.headers.get("content-type", "").split(";")[0].strip()
        return data, media_type

    def blob_exists(self, repository: str, digest: str, scopes: Sequence[str]) -> bool:
        response = self.request("HEAD", f"/v2/{repository}/blobs/{digest}", scopes)
        response.close()
        if response.status_code in REDIRECT_STATUSES or response.status_code == 200:
            return True
        if response.status_code == 404:
            return False
        raise_for_status(response, f"{self.registry}/{repository}")
        return False

    def open_blob(self, repository: str, digest: str, offset: int) -> BlobResponse:
        """A streamed GET of a blob from `offset`, redirects followed without credentials.

        No retries here: the caller retries with a fresh offset, so that bytes already written count.
        """
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        path = f"/v2/{repository}/blobs/{digest}"
        scopes = [pull_scope(repository)]
        self.ping()
        response = self._get_blob_url(urljoin(self.base_url + "/", path), headers, scopes)
        for _ in range(MAX_REDIRECTS):
            if response.status_code not in REDIRECT_STATUSES:
                break
            location = response.headers.get("location", "")
            response.close()
            target = urljoin(response.url, location)
            netpolicy.check_target(target, self._target_host, "redirect")
            response = self._get_blob_url(target, headers, None)  # no Authorization
        else:
            response.close()
            raise RegistryUnavailable(f"too many redirects for blob {digest[:19]}")
        if response.status_code not in (200, 206):
            with contextlib.closing(response):
                raise_for_status(response, f"blob {digest[:19]}")
        return response

    def _get_blob_url(self, url: str, headers: dict[str, str], scopes: Sequence[str] | None) -> BlobResponse:
        """One GET of a blob URL, authenticated for `scopes` (None: no credentials, a redirect target)."""

        def send(auth: dict[str, str]) -> BlobResponse:
            if proxy_configured(url):
                request = self.http.build_request("GET", url, headers={**headers, **auth})
                return BlobResponse.from_httpx(self.http.send(request, stream=True))
            return BlobResponse.get_direct(url, {**headers, **auth}, stall_timeout())

        if scopes is None:
            return send({})
        return self._send_authorized(scopes, send)

    # -- uploads ---------------------------------------------------------------------------------

    def mount_blob(self, repository: str, digest: str, source: str) -> str | None:
        """Cross-repository mount: None when mounted, else the upload URL the registry opened instead."""
        response = self.request(
            "POST",
            f"/v2/{repository}/blobs/uploads/?mount={digest}&from={source}",
            [push_scope(repository), pull_scope(source)],
        )
        response.close()
        if response.status_code == 201:
            return None
        raise_for_status(response, f"{self.registry}/{repository}")
        return self._location(response)

    def start_upload(self, repository: str) -> str:
        response = self.request("POST", f"/v2/{repository}/blobs/uploads/", [push_scope(repository)])
        response.close()
        raise_for_status(response, f"{self.registry}/{repository}")
        return self._location(response)

    def finish_upload(
        self, location: str, digest: str, scopes: Sequence[str], content: bytes | None = None
    ) -> None:
        """The PUT that closes an upload, with its last bytes (or none), naming the blob's digest."""
        # `&digest=` appended by hand: httpx `params=` would replace the upload URL's `_state` query
        url = location + ("&" if "?" in location else "?") + f"digest={digest}"
        headers = {"Content-Type": "application/octet-stream"} if content else {"Content-Length": "0"}
        response = self.request("PUT", url, scopes, headers=headers, content=content or None)
        response.close()
        raise_for_status(response, f"upload of blob {digest[:19]}")

    def http_location(self, response: httpx.Response, current: str) -> str:
        """The upload URL for the next request: the response's Location, else the current one."""
        return self._location(response) if response.headers.get("location") else current

    def _location(self, response: httpx.Response) -> str:
        location = response.headers.get("location")
        if not location:
            raise RegistryUnavailable(f"{self.registry} opened an upload without a Location")
        url = urljoin(str(response.url), str(location))
        if urlsplit(url).netloc != urlsplit(self.base_url).netloc:
            netpolicy.check_target(url, self._target_host, "upload location")
        return url

    def put_manifest(self, repository: str, tag: str, data: bytes, media_type: str) -> None:
        response = self.request(
            "PUT",
            f"/v2/{repository}/manifests/{tag}",
            [push_scope(repository)],
            headers={"Content-Type": media_type},
            content=data,
        )
        response.close()
        raise_for_status(response, f"{self.registry}/{repository}:{tag}")


def describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text[:200]


def read_capped(chunks: Iterable[bytes | memoryview], limit: int, what: str) -> bytes:
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) > limit:
            raise InvalidArtifact(f"{what} is larger than {limit} bytes")
    return bytes(data)


def raise_for_status(response: _Answer, what: str) -> None:
    status = response.status_code
    if status < 400:
        return
    if status == 404:
        raise ModelNotFound(f"not found in the registry: {what}")
    if status == 401:
        raise RegistryUnauthorized(f"access to {what} was refused (HTTP 401); log in with docker login")
    if status == 403:
        raise RegistryForbidden(f"access to {what} is forbidden (HTTP 403)")
    if status == 416:
        raise RegistryUnavailable(f"the registry refused the requested range of {what}")
    raise RegistryUnavailable(f"the registry answered HTTP {status} for {what}")
