"""Typed HTTP client of the daemon's API: the CLI's only way in.

Built on client_http.py, a small HTTP/1.1 transport, so that `model ls` stays quick to start (httpx alone
costs ~0.2 s of imports, http.client ~10 ms: it loads the email package and ssl). When no daemon is named
(MODEL_RUNNER_HOST, a context) and none listens, the client from `connect()` starts one in the background
at its first request, as DMR's CLI does. It sends the API key (MODEL_RUNNER_API_KEY or the context's) and
speaks HTTPS (MODEL_RUNNER_TLS) or a Unix socket (`unix:///path`) when told.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from modelrunner import client_http, config
from modelrunner.client_errors import NotTheRunner, Unreachable, daemon_error
from modelrunner.client_types import (
    DiskUsage,
    EnginesInfo,
    MemoryEstimate,
    Model,
    ModelConfiguration,
    Runner,
    Version,
)
from modelrunner.errors import DaemonError
from modelrunner.wire import REQUEST_ID_HEADER, SSEDecoder

if TYPE_CHECKING:
    import socket
    import ssl
    import subprocess

DAEMON_START_TIMEOUT = 30.0


def _streamed(response: client_http.Response) -> Iterator[bytes]:
    """A response's body as its bytes arrive (logs and records that are followed)."""
    with response:
        while chunk := response.read1(64 * 1024):
            yield chunk


def model_path(name: str) -> str:
    return quote(name.strip(), safe="/:@")


def tls_context(skip_verify: bool, ca_cert: str | None) -> ssl.SSLContext:
    """MODEL_RUNNER_TLS_SKIP_VERIFY / MODEL_RUNNER_TLS_CA_CERT, as DMR's LoadClientTLSConfig reads them; with
    neither, the certificate the local daemon made for itself (if any) is trusted besides the system's."""
    import contextlib
    import ssl  # only for an https:// daemon: ssl alone costs a few ms of start-up

    if skip_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if ca_cert:
        try:
            return ssl.create_default_context(cafile=ca_cert)
        except (OSError, ssl.SSLError) as exc:
            raise DaemonError(0, f"cannot load the TLS CA certificate {ca_cert}: {exc}") from None
    context = ssl.create_default_context()
    local_ca = config.runner_home() / "certs" / "ca.crt"
    if local_ca.is_file():
        with contextlib.suppress(OSError, ssl.SSLError):
            context.load_verify_locations(cafile=str(local_ca))
    return context


class Client:
    def __init__(
        self,
        base_url: str,
        timeout: float = 600.0,
        api_key: str | None = None,
        tls_skip_verify: bool = False,
        tls_ca_cert: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        self._socket_path = unquote(parts.path) if parts.scheme == "unix" else None
        if self._socket_path is None and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise DaemonError(0, f"invalid daemon address: {base_url}")
        if parts.scheme == "unix" and not self._socket_path:
            raise DaemonError(0, f"invalid daemon address: {base_url} (use unix:///path/to/socket)")
        self.base_url = base_url.rstrip("/")
        self._scheme = parts.scheme
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = "" if self._socket_path else parts.path.rstrip("/")
        self.timeout = timeout
        self.api_key = api_key
        self.openai_prefix: str | None = None  # set for an external OpenAI endpoint (see _openai)
        # set by connect(): starts the local daemon, the first time nothing listens where it should
        self.start_daemon: Callable[[], None] | None = None
        self._tls: ssl.SSLContext | None = (
            tls_context(tls_skip_verify, tls_ca_cert) if parts.scheme == "https" else None
        )

    @classmethod
    def for_openai_url(cls, url: str) -> Client:
        """A client of any OpenAI-compatible endpoint, e.g. `http://localhost:11434/v1` (`--openaiurl`)."""
        client = cls(url, api_key=os.environ.get("OPENAI_API_KEY") or None)
        client.openai_prefix = ""
        return client

    @classmethod
    def for_target(cls, target: config.ClientTarget) -> Client:
        return cls(
            target.base_url,
            api_key=target.api_key,
            tls_skip_verify=target.tls_skip_verify,
            tls_ca_cert=target.tls_ca_cert,
        )

    @property
    def is_local(self) -> bool:
        """True when the daemon runs on this machine, so it can read files by path."""
        return self._socket_path is not None or config.is_loopback_host(self._host)

    def _connect(self, timeout: float) -> socket.socket:
        """A connection to the daemon; when nothing listens and `start_daemon` is set, the daemon is
        started first (once). Trying the request itself, not a ping before it, saves every command a
        round trip."""
        while True:
            try:
                return client_http.connect(
                    self._host, self._port, timeout, unix_path=self._socket_path, tls=self._tls
                )
            except ConnectionRefusedError:
                start, self.start_daemon = self.start_daemon, None
                if start is None:
                    raise
                start()

    def _host_header(self) -> str:
        if self._socket_path is not None:
            return "localhost"
        return client_http.host_header(self._host, self._port, 443 if self._tls is not None else 80)

    def _tls_failure(self, exc: OSError) -> DaemonError | None:
        """A DaemonError that says how to trust the daemon's certificate, when `exc` is a TLS failure."""
        if self._tls is None:
            return None
        import ssl

        if not isinstance(exc, ssl.SSLError):
            return None
        return DaemonError(
            0,
            f"TLS with the model runner at {self.base_url} failed: {exc.reason or exc}; give its CA "
            "certificate with MODEL_RUNNER_TLS_CA_CERT (or MODEL_RUNNER_TLS_SKIP_VERIFY=true)",
        )

    def _not_the_runner(self, status: int) -> str:
        where = self._socket_path or f"{self._host}:{self._port}"
        return (
            f"something else answers on {where}: a web page (HTTP {status}), not the model runner's API; "
            "stop that program, or start the model runner on another port (model start-runner --port N) "
            "and name it in MODEL_RUNNER_HOST"
        )

    def _refused_key(self) -> str:
        if self.api_key is None:
            return (
                f"the model runner at {self.base_url} requires an API key: set MODEL_RUNNER_API_KEY "
                "(or give the context one: model context create NAME --host URL --api-key KEY)"
            )
        return f"the model runner at {self.base_url} refused the API key; check MODEL_RUNNER_API_KEY"

    def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes | Iterable[bytes] | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        with_token: bool = False,
    ) -> client_http.Response:
        """Send a request and return the open response; an answer >= 400 raises the DaemonError subclass of
        its kind (client_errors.py), with the daemon's request id. `with_token`: a route only for the
        daemon's own user, who may have to prove it with the local token."""
        url = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        all_headers = {"User-Agent": "modelrunner-cli", **(headers or {})}
        if self.api_key:
            all_headers["Authorization"] = f"Bearer {self.api_key}"
        sock = None
        try:
            sock = self._connect(self.timeout if timeout is None else timeout)
            if with_token:
                all_headers.update(_token_headers(sock))
            client_http.send_request(sock, method, url, self._host_header(), all_headers, body)
            response = client_http.Response(sock, method)
        except OSError as exc:  # first: a failed certificate check is a ValueError too
            if sock is not None:
                sock.close()
            raise self._tls_failure(exc) or Unreachable(
                0, f"cannot reach the model runner at {self.base_url}: {exc}"
            ) from None
        except ValueError as exc:  # a header or path that cannot be sent as it is
            if sock is not None:
                sock.close()
            raise DaemonError(0, f"cannot send this request to {self.base_url}: {exc}") from None
        if (response.getheader("Content-Type") or "").startswith("text/html"):
            # no route of a model runner (DMR's or ours) answers HTML: its page would be shown as the error
            response.close()
            raise NotTheRunner(0, self._not_the_runner(response.status))
        if response.status >= 400:
            data = response.read()
            response.close()
            # the daemon's own API key check (a registry's 401 on a pull comes without the header)
            own_key_check = response.status == 401 and response.getheader("WWW-Authenticate")
            raise daemon_error(
                response.status,
                data,
                path,
                request_id=response.getheader(REQUEST_ID_HEADER.decode()),
                retry_after=response.getheader("Retry-After"),
                message=self._refused_key() if own_key_check else None,
            )
        return response

    def call(self, method: str, path: str, *, payload: Any = None, **kwargs: Any) -> Any:
        """A JSON request with a JSON (or empty) answer."""
        if payload is not None:
            kwargs["body"] = json.dumps(payload).encode()
            kwargs["headers"] = {"Content-Type": "application/json", **kwargs.get("headers", {})}
        with self.open(method, path, **kwargs) as response:
            data = response.read()
        if not data:
            return None
        if (response.getheader("Content-Type") or "").startswith("application/json"):
            return json.loads(data)
        return data.decode("utf-8", "replace")

    def ping(self) -> bool:
        """True when a model runner answers; a missing or wrong API key is an error, not "no daemon"
        (starting a second daemon would not help)."""
        try:
            self.call("GET", "/version", timeout=2.0)
            return True
        except DaemonError as exc:
            if exc.status_code == 401 or isinstance(exc, NotTheRunner):
                raise
            return exc.status_code != 0

    # -- the API, one method per route -----------------------------------------------------------

    def version(self) -> Version:
        return Version.from_json(self.call("GET", "/version"))

    def list_models(self) -> list[Model]:
        return [Model.from_json(doc) for doc in self.call("GET", "/models")]

    def get_model(self, name: str, remote: bool = False) -> Model:
        params = {"remote": "true"} if remote else None
        return Model.from_json(self.call("GET", f"/models/{model_path(name)}", params=params))

    def verify_model(self, name: str, public_pems: list[str], deep: bool) -> dict[str, Any]:
        """A stored model checked against its kept signature (`model verify --local`)."""
        body = {"keys": public_pems, "deep": deep}
        result: dict[str, Any] = self.call("POST", f"/models/{model_path(name)}/verify", payload=body)
        return result

    def delete_model(self, name: str, force: bool = False) -> list[dict[str, str]]:
        params = {"force": "true"} if force else None
        result: list[dict[str, str]] = self.call("DELETE", f"/models/{model_path(name)}", params=params)
        return result

    def tag_model(self, source: str, target: str) -> dict[str, str]:
        repo, tag = split_tag(target)
        result: dict[str, str] = self.call(
            "POST", f"/models/{model_path(source)}/tag", params={"repo": repo, "tag": tag}
        )
        return result

    def repackage(self, source: str, target: str, context_size: int | None) -> dict[str, str]:
        payload: dict[str, Any] = {"target": target}
        if context_size is not None:
            payload["context_size"] = context_size
        result: dict[str, str] = self.call("POST", f"/models/{model_path(source)}/repackage", payload=payload)
        return result

    def package(self, request: dict[str, Any]) -> dict[str, Any]:
        """The daemon reads the files itself: only for its own user (a 403 otherwise: upload the files
        instead)."""
        result: dict[str, Any] = self.call("POST", "/models/package", payload=request, with_token=True)
        return result

    def load(self, tar_chunks: Iterable[bytes]) -> str:
        """POST a model tar; returns the new model's ID."""
        with self.open(
            "POST", "/models/load", body=tar_chunks, headers={"Content-Type": "application/x-tar"}
        ) as response:
            lines = [json.loads(line) for line in response.read().splitlines() if line.strip()]
        for line in lines:
            if line.get("type") == "error":
                raise DaemonError(500, str(line.get("message")))
        return str(lines[-1]["id"])

    def export(self, name: str) -> Iterator[bytes]:
        response = self.open("GET", f"/models/{model_path(name)}/export")
        with response:
            while chunk := response.read(1024 * 1024):
                yield chunk

    def purge(self) -> None:
        self.call("DELETE", "/models/purge")

    def disk_usage(self) -> DiskUsage:
        return DiskUsage.from_json(self.call("GET", "/engines/df"))

    def _progress_lines(self, path: str, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST, then yield the streamed progress events one by one as they arrive."""
        response = self.open(
            "POST",
            path,
            body=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        with response:
            while line := response.readline():
                if line.strip():
                    yield json.loads(line)

    def pull(self, name: str, bearer_token: str | None = None) -> Iterator[dict[str, Any]]:
        payload: dict[str, Any] = {"from": name}
        if bearer_token:
            payload["bearer-token"] = bearer_token
        return self._progress_lines("/models/create", payload)

    def push(self, name: str, bearer_token: str | None = None) -> Iterator[dict[str, Any]]:
        payload: dict[str, Any] = {"bearer-token": bearer_token} if bearer_token else {}
        return self._progress_lines(f"/models/{model_path(name)}/push", payload)

    # -- inference and the scheduler ---------------------------------------------------------------

    def _openai(self, backend: str | None) -> str:
        """Where the OpenAI routes live: `/engines[/{backend}]/v1` here, the URL itself for an external
        OpenAI-compatible endpoint (`--openaiurl`, whose URL already ends in its version path)."""
        if self.openai_prefix is not None:
            return self.openai_prefix
        return f"/engines/{backend}/v1" if backend else "/engines/v1"

    def chat_stream(
        self, model: str, messages: list[dict[str, Any]], backend: str | None = None, **options: Any
    ) -> Iterator[dict[str, Any]]:
        """Stream a chat completion: yields each SSE event's JSON (OpenAI chunks, or an error event); a
        stream cut short or garbled raises DaemonError, so a chat can report it and go on."""
        payload = {"model": model, "messages": messages, "stream": True, **options}
        response = self.open(
            "POST",
            f"{self._openai(backend)}/chat/completions",
            body=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        with response:
            try:
                if not (response.getheader("Content-Type") or "").startswith("text/event-stream"):
                    yield json.loads(response.read())  # a server that answered without streaming
                    return
                decoder = SSEDecoder()
                while True:
                    chunk = response.read1(64 * 1024)
                    events = decoder.feed(chunk) if chunk else decoder.end()  # the end completes the last
                    for _, data in events:
                        if data == b"[DONE]":
                            return
                        yield json.loads(data)
                    if not chunk:
                        return
            except OSError as exc:  # client_http.ProtocolError among them
                raise DaemonError(0, f"the answer was cut short: {exc or exc.__class__.__name__}") from None
            except ValueError:
                raise DaemonError(0, "the model runner sent an answer that is not valid JSON") from None

    def preload(self, model: str, backend: str | None = None) -> None:
        self.call(
            "POST",
            f"{self._openai(backend)}/chat/completions",
            payload={"model": model, "messages": []},
            headers={"X-Preload-Only": "true"},
        )

    def list_openai(self) -> dict[str, Any]:
        """The OpenAI model list (`GET /engines/v1/models`, or `{url}/models` of an external endpoint)."""
        result: dict[str, Any] = self.call("GET", f"{self._openai(None)}/models")
        return result

    def openai_model(self, name: str) -> dict[str, Any]:
        """One model as the OpenAI route describes it (`GET /engines/v1/models/{name}`)."""
        result: dict[str, Any] = self.call("GET", f"{self._openai(None)}/models/{model_path(name)}")
        return result

    def ps(self) -> list[Runner]:
        return [Runner.from_json(doc) for doc in self.call("GET", "/engines/ps")]

    def unload(self, models: list[str], unload_all: bool, backend: str | None) -> int:
        # DMR's UnloadRequest, every field present as its CLI sends it (cmd/cli/desktop/desktop.go)
        payload = {"all": unload_all, "backend": backend or "", "models": models or None}
        result: dict[str, int] = self.call("POST", "/engines/unload", payload=payload)
        return result["unloaded_runners"]

    def configure(self, request: dict[str, Any], backend: str | None = None) -> None:
        path = f"/engines/{backend}/_configure" if backend else "/engines/_configure"
        self.call("POST", path, payload=request)

    def configuration(self, model: str | None = None) -> list[ModelConfiguration]:
        found = self.call("GET", "/engines/_configure", params={"model": model} if model else None)
        return [ModelConfiguration.from_json(doc) for doc in found]

    def logs(self, follow: bool, no_engines: bool, model: str | None = None) -> Iterator[bytes]:
        params = {"follow": str(follow).lower(), "no-engines": str(no_engines).lower()}
        if model:
            params["model"] = model
        timeout = 1e9 if follow else None
        yield from _streamed(self.open("GET", "/logs", params=params, timeout=timeout, with_token=True))

    def requests(self, model: str | None, follow: bool, include_existing: bool) -> Iterator[bytes]:
        """The request recorder (`GET /engines/requests`): its JSON, or with `follow` its event stream, as
        the bytes come (DMR's desktop.go Requests)."""
        params = {"model": model} if model else {}
        if follow and include_existing:
            params["include_existing"] = "true"
        accept = "text/event-stream" if follow else "application/json"
        headers = {"Accept": accept, "Cache-Control": "no-cache"} if follow else {"Accept": accept}
        yield from _streamed(
            self.open(
                "GET",
                "/engines/requests",
                params=params or None,
                headers=headers,
                timeout=1e9 if follow else None,
                with_token=True,
            )
        )

    # -- engines ------------------------------------------------------------------------------------

    def engines_status(self) -> dict[str, str]:
        """DMR's shape: {backend: "Running: llama.cpp b11434" | "Not Installed: ..." | ...}."""
        result: dict[str, str] = self.call("GET", "/engines/status", timeout=30.0)
        return result

    def engines_info(self) -> EnginesInfo:
        """Structured engine states, the platform and the accelerator found (our route)."""
        return EnginesInfo.from_json(self.call("GET", "/engines/info", timeout=30.0))

    def estimate(self, model: str) -> MemoryEstimate:
        """The memory one runner of the model needs on the daemon's machine (our route)."""
        return MemoryEstimate.from_json(self.call("GET", "/engines/estimate", params={"model": model}))

    def cluster(self) -> dict[str, list[dict[str, Any]]]:
        """What the engines use beyond this machine (Ray clusters), probed by the daemon (our route)."""
        result: dict[str, list[dict[str, Any]]] = self.call("GET", "/engines/cluster", timeout=300.0)
        return result

    def install_backend(
        self, backend: str, gpu: str = "auto", version: str | None = None, force: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Stream the install's progress events; the last is {"type": "success"|"error", ...}."""
        payload: dict[str, Any] = {"backend": backend, "gpu": gpu, "force": force}
        if version:
            payload["version"] = version
        return self._progress_lines("/engines/install-backend", payload)

    def uninstall_backend(self, backend: str) -> dict[str, str]:
        result: dict[str, str] = self.call("POST", "/engines/uninstall-backend", payload={"backend": backend})
        return result


def local_token() -> str | None:
    """The local daemon's token, when this user may read it (the daemon's own user)."""
    try:
        return config.local_token_file().read_text().strip() or None
    except OSError:
        return None


def _token_headers(sock: socket.socket) -> dict[str, str]:
    """The local token, for a daemon that needs it and runs as this user: one on a Unix socket whose
    listener is this uid (server/localuser.py). Over TCP the daemon knows its caller from the connection,
    so the token never goes there, where another user's listener on the port would get it."""
    from modelrunner.server.localuser import unix_peer_uid

    token = local_token() if unix_peer_uid(sock) == os.geteuid() else None
    return {"X-Model-Runner-Token": token} if token else {}


def split_tag(target: str) -> tuple[str, str]:
    """`repo[:tag]` -> (repo, tag), minding registry ports (`host:5000/repo`)."""
    name, sep, tag = target.rpartition(":")
    if sep and "/" not in tag:
        return name, tag
    return target, "latest"


def start_daemon_in_background(tls: bool = False) -> subprocess.Popen[bytes]:
    """`model serve` detached from this terminal, logging to the runner's log folder; with its TLS listener
    on when the CLI was told to use TLS (MODEL_RUNNER_TLS=true)."""
    import subprocess

    log_dir = config.logs_dir()
    log_dir.mkdir(parents=True, exist_ok=True)
    env = os.environ.copy()
    if tls:
        env["MODEL_RUNNER_TLS_ENABLED"] = "true"
    env[config.LOG_STDERR] = "0"  # its lines are in logs/daemon.log; the file below keeps the rest (a crash)
    with open(log_dir / "daemon.stdout.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "modelrunner", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )


def wait_until_up(
    client: Client, process: subprocess.Popen[bytes] | None, timeout: float = DAEMON_START_TIMEOUT
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.ping():
            return
        if process is not None and process.poll() is not None:
            raise DaemonError(
                0, f"the model runner exited at start; see {config.logs_dir() / 'daemon.stdout.log'}"
            )
        time.sleep(0.05)
    raise DaemonError(0, f"the model runner did not start within {timeout:.0f} s")


def connect(autostart: bool = True, quiet: bool = False) -> Client:
    """A client of the daemon the environment names; when none is named, the local daemon is started at
    the first request that finds none listening. `quiet` keeps stderr clean for machine-read output
    (Compose reads `ls --json` with stderr merged)."""
    target = config.client_target()
    client = Client.for_target(target)
    if autostart and not target.explicit:

        def start() -> None:
            if not quiet:
                print("Starting the model runner in the background...", file=sys.stderr)
            wait_until_up(client, start_daemon_in_background(tls=client.base_url.startswith("https:")))

        client.start_daemon = start
    return client
