"""Routes of the dashboard: the page, its assets, and what the page needs that no other route answers.

* `GET /dashboard` (and `/dashboard/`): the page; `GET /dashboard/assets/<file>`: its scripts and styles.
  Every file is read from the package once, at start, with its gzip form and an ETag; nothing is fetched
  from elsewhere, and only files that exist in the package can be named.
* `GET /dashboard/api/overview`: the scheduler's limits and usage (the memory budget is in no other route).
* `GET /dashboard/api/models/{name}/files`: a model's layers and the text of its licences.
* `GET /dashboard/api/caller`: whether the daemon reads files by path for this browser (the package form):
  only for its own user, known by the owner of the browser's connection (server/localuser.py). The API key
  does not make a browser that user: the key is what every client of the API is given (containers,
  Compose services), not a proof of who runs the browser.

Every response carries a strict Content-Security-Policy: scripts and styles from this origin only, no inline
code, no framing.
"""

from __future__ import annotations

import gzip
import hashlib
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelrunner import __version__
from modelrunner.artifact import mediatypes as mt
from modelrunner.errors import BadRequest, ModelNotFound, PermissionDenied
from modelrunner.scheduler.scheduler import Scheduler
from modelrunner.server.models_api import check_caller_may_read_files
from modelrunner.store.store import ModelStore

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
LICENSE_TEXT_LIMIT = 64 * 1024  # bytes of each licence shown; longer ones are cut


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes
    content_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """Every file under static/, by its path relative to it ("index.html", "js/app.js", ...)."""
    assets: dict[str, Asset] = {}
    root = resources.files(__package__).joinpath("static")

    def walk(folder: Any, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
                continue
            suffix = "." + entry.name.rsplit(".", 1)[-1]
            if suffix not in _TYPES:
                continue
            body = entry.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
            assets[prefix + entry.name] = Asset(body, gzip.compress(body, 9, mtime=0), _TYPES[suffix], etag)

    walk(root, "")
    return assets


def _serve(asset: Asset, request: Request) -> Response:
    headers = {**SECURITY_HEADERS, "ETag": asset.etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return Response(asset.gzipped, media_type=asset.content_type, headers=headers)
    return Response(asset.body, media_type=asset.content_type, headers=headers)


def _json(data: Any) -> JSONResponse:
    return JSONResponse(data, headers={**SECURITY_HEADERS, "Cache-Control": "no-store"})


def model_files(store: ModelStore, name: str) -> dict[str, Any]:
    model = store.get(name)
    layers = [
        {
            "digest": layer.digest,
            "media_type": layer.media_type,
            "size": layer.size,
            "path": layer.filepath,
        }
        for layer in model.manifest.layers
    ]
    licenses = []
    for layer in model.manifest.layers:
        if layer.media_type != mt.LICENSE:
            continue
        with open(store.layout.blob_path(layer.digest), "rb") as handle:
            data = handle.read(LICENSE_TEXT_LIMIT + 1)
        licenses.append(
            {
                "digest": layer.digest,
                "path": layer.filepath,
                "text": data[:LICENSE_TEXT_LIMIT].decode("utf-8", "replace"),
                "truncated": len(data) > LICENSE_TEXT_LIMIT,
            }
        )
    return {"id": model.id, "tags": model.tags, "layers": layers, "licenses": licenses}


def build_dashboard_router(store: ModelStore, scheduler: Scheduler, token: str) -> APIRouter:
    router = APIRouter()
    assets = load_assets()
    page = assets["index.html"]

    @router.get("/dashboard", include_in_schema=False)
    @router.get("/dashboard/", include_in_schema=False)
    def dashboard(request: Request) -> Response:
        return _serve(page, request)

    @router.get("/dashboard/assets/{name:path}", include_in_schema=False)
    def asset(name: str, request: Request) -> Response:
        found = assets.get(name)
        if found is None or name == "index.html":
            raise ModelNotFound("no such file in the dashboard")
        return _serve(found, request)

    @router.get("/dashboard/api/overview")
    def overview() -> JSONResponse:
        runners = list(scheduler.runners.values())
        limits = scheduler.limits
        return _json(
            {
                "version": __version__,
                "now": time.time(),  # the page corrects keep-alive countdowns for its own clock's offset
                "memory_budget": limits.memory_budget,
                "memory_in_use": sum(runner.memory for runner in runners),
                "max_runners": limits.max_runners,
                "max_queue": limits.max_waiting,
                "default_keep_alive": limits.default_keep_alive,
                "loaded_runners": len(runners),
                "queue_depth": scheduler.waiting,
            }
        )

    @router.get("/dashboard/api/caller")
    def caller(request: Request) -> JSONResponse:
        try:
            check_caller_may_read_files(request, token)
        except (BadRequest, PermissionDenied) as refused:
            return _json({"reads_files": False, "reason": refused.message})
        return _json({"reads_files": True})

    @router.get("/dashboard/api/models/{name:path}/files")
    def files(name: str) -> JSONResponse:
        return _json(model_files(store, name))

    return router
