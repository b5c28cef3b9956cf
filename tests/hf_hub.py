"""A local test double of the Hugging Face Hub (the real one is unreachable here): the routes a model pull
uses, serving repositories held in memory.

* `GET /api/models/{org}/{name}`: model info (`sha`, `lastModified`, `siblings`)
* `GET /api/models/{org}/{name}/tree/{revision}[/{path}]`: the file list (`recursive` honoured)
* `GET /{org}/{name}/resolve/{revision}/{path}`: file contents, `Range: bytes=N-` answered with 206 as the
  Hub's CDN does

Large files (.gguf, .safetensors) are listed with their LFS sha256, as on the Hub. Faults for resume tests:
`cut_after` (a download of that file stops after N bytes of the body, `times` times), `ignore_range`
(always 200 with the whole file), `corrupt` (one byte of that file flipped in what is sent).

Private repositories need `Authorization: Bearer <token>`; unknown ones answer 404 with the Hub's
`X-Error-Code: RepoNotFound`, which huggingface_hub turns into RepositoryNotFoundError.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.daemon import free_port

LAST_MODIFIED = "2025-03-01T12:00:00.000Z"


@dataclass
class HubRepo:
    files: dict[str, bytes]
    token: str | None = None  # private when set


@dataclass
class Download:
    path: str
    revision: str
    range: str | None
    sent: int  # body bytes written


@dataclass
class FakeHub:
    repos: dict[str, HubRepo] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    downloads: list[str] = field(default_factory=list)
    requests: list[Download] = field(default_factory=list)
    cut_after: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (bytes, times)
    ignore_range: bool = False
    corrupt: set[str] = field(default_factory=set)
    _server: ThreadingHTTPServer | None = None

    def sent(self, path: str) -> int:
        return sum(r.sent for r in self.requests if r.path == path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _tree(self, repo: HubRepo, prefix: str, recursive: bool) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        folders: set[str] = set()
        for path, data in sorted(repo.files.items()):
            if prefix and not path.startswith(prefix + "/"):
                continue
            rest = path[len(prefix) + 1 :] if prefix else path
            if "/" in rest and not recursive:
                folders.add((prefix + "/" if prefix else "") + rest.split("/", 1)[0])
                continue
            parts = path.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if recursive and (not prefix or folder.startswith(prefix + "/")):
                    folders.add(folder)
            oid = hashlib.sha1(data).hexdigest()
            entry: dict[str, Any] = {"type": "file", "oid": oid, "size": len(data), "path": path}
            if path.endswith((".gguf", ".safetensors")):
                sha256 = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"oid": sha256, "size": len(data), "pointerSize": 134}
            entries.append(entry)
        dirs = [{"type": "directory", "oid": "0" * 40, "path": f} for f in sorted(folders)]
        return dirs + entries

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _send(
                self, status: int, body: bytes, content_type: str = "application/json", **extra: str
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in extra.items():
                    self.send_header(key.replace("_", "-"), value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _repo(self, name: str) -> HubRepo | None:
                repo = hub.repos.get(name)
                if repo is None:
                    self._send(404, b'{"error":"Repository not found"}', X_Error_Code="RepoNotFound")
                    return None
                if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
                    self._send(401, b'{"error":"Invalid credentials"}', X_Error_Code="RepoNotFound")
                    return None
                return repo

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                path = unquote(parts.path)
                query = parse_qs(parts.query)
                segments = path.strip("/").split("/")
                if segments[:2] == ["api", "models"] and len(segments) >= 4:
                    name = "/".join(segments[2:4])
                    repo = self._repo(name)
                    if repo is None:
                        return
                    if len(segments) == 4:
                        info = {
                            "id": name,
                            "modelId": name,
                            "sha": "c0ffee" * 6 + "ab",
                            "lastModified": LAST_MODIFIED,
                            "private": bool(repo.token),
                            "siblings": [{"rfilename": p} for p in sorted(repo.files)],
                        }
                        self._send(200, json.dumps(info).encode())
                        return
                    if segments[4] == "tree":
                        prefix = "/".join(segments[6:])
                        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
                        self._send(200, json.dumps(hub._tree(repo, prefix, recursive)).encode())
                        return
                if len(segments) >= 5 and segments[2] == "resolve":
                    repo = self._repo("/".join(segments[:2]))
                    if repo is None:
                        return
                    file_path = "/".join(segments[4:])
                    if file_path not in repo.files:
                        self._send(404, b'{"error":"Entry not found"}', X_Error_Code="EntryNotFound")
                        return
                    hub.downloads.append(file_path)
                    self._file(file_path, segments[3], repo.files[file_path])
                    return
                self._send(404, b'{"error":"not found"}')

            def _file(self, path: str, revision: str, data: bytes) -> None:
                if path in hub.corrupt:
                    data = data[:-1] + bytes([data[-1] ^ 1])
                asked = self.headers.get("Range")
                start = 0
                if asked and not hub.ignore_range:
                    start = int(asked.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self._send(416, b"", "text/plain", Content_Range=f"bytes */{len(data)}")
                        return
                body = data[start:]
                limit, times = hub.cut_after.get(path, (len(body), 0))
                if times:
                    hub.cut_after[path] = (limit, times - 1)
                    body_sent = body[:limit]
                else:
                    body_sent = body
                record = Download(path, revision, asked, len(body_sent))
                hub.requests.append(record)
                self.send_response(206 if start else 200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if self.command == "HEAD":
                    return
                self.wfile.write(body_sent)
                if len(body_sent) < len(body):
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)  # cut mid-body, as a dropped connection

            do_HEAD = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
