"""The daemon's HTTP application: one router module per API family, errors mapped in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from modelrunner import __version__, config
from modelrunner.server.errors import install_error_handlers
from modelrunner.server.models_api import build_models_router
from modelrunner.store.store import ModelStore


def _folder_size(path: Path) -> int:
    total = 0
    if path.is_dir():
        for item in path.rglob("*"):
            if item.is_file() and not item.is_symlink():
                total += item.stat().st_size
    return total


def create_app(store: ModelStore | None = None) -> FastAPI:
    store = store or ModelStore(config.models_path())
    app = FastAPI(title="modelrunner", version=__version__, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.state.store = store

    @app.get("/", response_class=PlainTextResponse)
    def root() -> str:
        return "Docker Model Runner is running"

    @app.get("/version")
    def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/engines/df")
    def disk_usage() -> dict[str, Any]:
        return {
            "models_disk_usage": store.disk_usage(),
            "default_backend_disk_usage": _folder_size(config.runner_home() / "engines" / "llama.cpp"),
        }

    app.include_router(build_models_router(store))
    return app
