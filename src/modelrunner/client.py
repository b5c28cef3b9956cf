"""Typed HTTP client of the daemon's API: the CLI's only way in.

Built on the standard library's http.client so that `model ls` stays quick to start (httpx alone costs
~0.2 s of imports). When MODEL_RUNNER_HOST is unset and no daemon answers, `connect()` starts one in the
background first, as DMR's CLI does.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from modelrunner import config
from modelrunner.errors import DaemonError

DAEMON_START_TIMEOUT = 30.0


def _error_message(status: int, body: bytes) -> str:
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            error = doc.get("error")
            if isinstance(error, dict) and error.get("message"):
                return str(error["message"])
            if isinstance(error, str):
                return error
            if doc.get("message"):
                return str(doc["message"])
    except ValueError:
        pass
    text = body.decode("utf-8", "replace").strip()
    return text[:500] or f"HTTP {status}"


def model_path(name: str) -> str:
    return quote(name.strip(), safe="/:@")


class Client:
    def __init__(self, base_url: str, timeout: float = 600.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DaemonError(0, f"invalid daemon address: {base_url}")
        self.base_url = base_url.rstrip("/")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        self.timeout = timeout

    @property
    def is_local(self) -> bool:
        """True when the daemon runs on this machine, so it can read files by path."""
        if self._host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self._host).is_loopback
        except ValueError:
            return False

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes | Iterable[bytes] | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> http.client.HTTPResponse:
        """Send a request and return the open response; raises DaemonError on >= 400."""
        url = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        all_headers = {"User-Agent": "modelrunner-cli", **(headers or {})}
        conn = self._connection(self.timeout if timeout is None else timeout)
        try:
            chunked = body is not None and not isinstance(body, bytes)
            conn.request(method, url, body=body, headers=all_headers, encode_chunked=chunked)
            response = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise DaemonError(0, f"cannot reach the model runner at {self.base_url}: {exc}") from None
        if response.status >= 400:
            data = response.read()
            conn.close()
            raise DaemonError(response.status, _error_message(response.status, data))
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
        if response.getheader("Content-Type", "").startswith("application/json"):
            return json.loads(data)
        return data.decode("utf-8", "replace")

    def ping(self) -> bool:
        try:
            self.call("GET", "/version", timeout=2.0)
            return True
        except DaemonError:
            return False

    # -- the API, one method per route -----------------------------------------------------------

    def version(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", "/version")
        return result

    def list_models(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("GET", "/models")
        return result

    def get_model(self, name: str, remote: bool = False) -> dict[str, Any]:
        params = {"remote": "true"} if remote else None
        result: dict[str, Any] = self.call("GET", f"/models/{model_path(name)}", params=params)
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
        result: dict[str, Any] = self.call("POST", "/models/package", payload=request)
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

    def disk_usage(self) -> dict[str, int]:
        result: dict[str, int] = self.call("GET", "/engines/df")
        return result

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

    def chat_stream(
        self, model: str, messages: list[dict[str, Any]], backend: str | None = None, **options: Any
    ) -> Iterator[dict[str, Any]]:
        """Stream a chat completion: yields each SSE event's JSON (OpenAI chunks, or an error)."""
        prefix = f"/engines/{backend}" if backend else "/engines"
        payload = {"model": model, "messages": messages, "stream": True, **options}
        response = self.open(
            "POST",
            f"{prefix}/v1/chat/completions",
            body=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        with response:
            for raw in response:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield json.loads(data)

    def preload(self, model: str, backend: str | None = None) -> None:
        prefix = f"/engines/{backend}" if backend else "/engines"
        self.call(
            "POST",
            f"{prefix}/v1/chat/completions",
            payload={"model": model, "messages": []},
            headers={"X-Preload-Only": "true"},
        )

    def ps(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("GET", "/engines/ps")
        return result

    def unload(self, models: list[str], unload_all: bool, backend: str | None) -> int:
        payload: dict[str, Any] = {"all": unload_all, "models": models}
        if backend:
            payload["backend"] = backend
        result: dict[str, int] = self.call("POST", "/engines/unload", payload=payload)
        return result["unloaded_runners"]

    def configure(self, request: dict[str, Any], backend: str | None = None) -> None:
        path = f"/engines/{backend}/_configure" if backend else "/engines/_configure"
        self.call("POST", path, payload=request)

    def configuration(self, model: str | None = None) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call(
            "GET", "/engines/_configure", params={"model": model} if model else None
        )
        return result

    def logs(self, follow: bool, no_engines: bool) -> Iterator[bytes]:
        params = {"follow": str(follow).lower(), "no-engines": str(no_engines).lower()}
        response = self.open("GET", "/logs", params=params, timeout=1e9 if follow else None)
        with response:
            while chunk := response.read1(64 * 1024):
                yield chunk

    def requests(self, model: str | None, follow: bool, include_existing: bool) -> Iterator[bytes]:
        """The request recorder (`GET /engines/requests`): its JSON, or with `follow` its event stream, as
        the bytes come (DMR's desktop.go Requests)."""
        params = {"model": model} if model else {}
        if follow and include_existing:
            params["include_existing"] = "true"
        accept = "text/event-stream" if follow else "application/json"
        headers = {"Accept": accept, "Cache-Control": "no-cache"} if follow else {"Accept": accept}
        response = self.open(
            "GET",
            "/engines/requests",
            params=params or None,
            headers=headers,
            timeout=1e9 if follow else None,
        )
        with response:
            while chunk := response.read1(64 * 1024):
                yield chunk

    # -- engines ------------------------------------------------------------------------------------

    def engines_status(self) -> dict[str, str]:
        """DMR's shape: {backend: "Running: llama.cpp b11434" | "Not Installed: ..." | ...}."""
        result: dict[str, str] = self.call("GET", "/engines/status", timeout=30.0)
        return result

    def engines_info(self) -> dict[str, Any]:
        """Structured engine states, the platform and the accelerator found (our route)."""
        result: dict[str, Any] = self.call("GET", "/engines/info", timeout=30.0)
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


def split_tag(target: str) -> tuple[str, str]:
    """`repo[:tag]` -> (repo, tag), minding registry ports (`host:5000/repo`)."""
    name, sep, tag = target.rpartition(":")
    if sep and "/" not in tag:
        return name, tag
    return target, "latest"


def start_daemon_in_background() -> subprocess.Popen[bytes]:
    """`model serve` detached from this terminal, logging to the runner's log folder."""
    log_dir = config.logs_dir()
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "daemon.stdout.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "modelrunner", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ.copy(),
        )


def wait_until_up(client: Client, process: subprocess.Popen[bytes] | None, timeout: float) -> None:
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


def connect(autostart: bool = True) -> Client:
    target = config.client_target()
    client = Client(target.base_url)
    if autostart and not target.explicit and not client.ping():
        print("Starting the model runner in the background...", file=sys.stderr)
        wait_until_up(client, start_daemon_in_background(), DAEMON_START_TIMEOUT)
    return client
