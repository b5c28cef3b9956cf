"""The HTTP face of the server: `/health`, `/v1/models` and `/v1/images/generations` (contract 6).

The socket is served while the pipeline loads, so readiness is `/health` turning from 503 to 200.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .params import BadParameter, ImageRequest, WrongModel, check_model, parse_request

_TYPES = {400: "invalid_request_error", 421: "misdirected_request", 503: "service_unavailable"}


class Generator(Protocol):
    def generate(self, request: ImageRequest, cancelled: threading.Event) -> list[bytes]:
        """The images; stops early (raising) once `cancelled` is set."""
        ...


@dataclass
class ServerState:
    served_names: tuple[str, ...]
    pipeline: Generator | None = None  # set by the loader once the model is in memory
    created: int = field(default_factory=lambda: int(time.time()))


async def _cancel_on_disconnect(request: Request, cancelled: threading.Event) -> None:
    """Set `cancelled` when the client disconnects (the body has been read: only that is left to come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    cancelled.set()


def error(status: int, message: str) -> JSONResponse:
    body = {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "code": status}}
    return JSONResponse(body, status_code=status)


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="modelrunner diffusers server", docs_url=None, redoc_url=None, openapi_url=None)
    busy = asyncio.Lock()  # a pipeline is not thread-safe: one generation at a time, the others queue

    @app.get("/health")
    async def health() -> JSONResponse:
        loaded = state.pipeline is not None
        body = {"status": "healthy" if loaded else "loading", "model_loaded": loaded}
        return JSONResponse(body, status_code=200 if loaded else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        entry = {
            "id": state.served_names[0],
            "object": "model",
            "created": state.created,
            "owned_by": "diffusers",
        }
        return {"object": "list", "data": [entry]}

    @app.post("/v1/images/generations")
    async def generations(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            return error(400, "the request body is not valid JSON")
        try:
            check_model(body.get("model") if isinstance(body, dict) else None, state.served_names)
            parsed = parse_request(body)
        except WrongModel as exc:
            return error(421, str(exc))
        except BadParameter as exc:
            return error(400, str(exc))
        pipeline = state.pipeline
        if pipeline is None:
            return error(503, "the model is still loading; retry shortly")
        # A client that leaves (the daemon closes this connection for it) stops the work at the next
        # denoising step, and a request waiting its turn never starts.
        cancelled = threading.Event()
        watcher = asyncio.create_task(_cancel_on_disconnect(request, cancelled))
        try:
            async with busy:
                if cancelled.is_set():
                    return error(499, "the client closed the connection")
                print("diffusers server: image generation started", flush=True)  # its end is the answer
                images = await asyncio.to_thread(pipeline.generate, parsed, cancelled)
        except Exception as exc:  # a pipeline failure answers this request; the server stays up
            if cancelled.is_set():
                print("diffusers server: image generation stopped: the client left", flush=True)
                return error(499, "the client closed the connection")
            return error(500, f"image generation failed: {exc.__class__.__name__}: {str(exc)[:300]}")
        finally:
            watcher.cancel()
        data = [{"b64_json": base64.b64encode(png).decode("ascii")} for png in images]
        return JSONResponse({"created": int(time.time()), "data": data})

    return app
