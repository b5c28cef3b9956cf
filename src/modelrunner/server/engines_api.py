"""Engine admin routes (contract 2.2): status, install and uninstall of backends.

`GET /engines/status` keeps DMR's shape ({backend: "Running: llama.cpp b11434", ...}); `GET /engines/info` is
ours: the same plus structured fields and the accelerator found, for `model status`. An install streams
newline-delimited JSON progress lines, as pulls do, and ends with a success or error line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from modelrunner.compat.bodies import json_body
from modelrunner.engines.base import Engine, InstallState
from modelrunner.engines.gpu import GPU_KINDS, detect_accelerator
from modelrunner.engines.registry import EngineRegistry, is_supported_here, platform_name
from modelrunner.errors import BadRequest, EngineUnsupported, ModelRunnerError

_log = logging.getLogger(__name__)

# Called with a backend name before it is uninstalled: the scheduler stops that backend's runners.
BeforeUninstall = Callable[[str], Awaitable[object]]


class InstallRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    backend: str = Field(min_length=1, max_length=64)
    version: str | None = Field(default=None, max_length=64)
    gpu: str = "auto"
    force: bool = False  # reinstall even when a working engine is there


class UninstallRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    backend: str = Field(min_length=1, max_length=64)


def can_install_here(engine: Engine) -> bool:
    """Whether an install can succeed here, as the engine's own check before any work says (an engine that
    runs here but not in modelrunner yet, or not on this platform, cannot): the dashboard offers Install
    only then."""
    try:
        engine.prepare_install()
    except EngineUnsupported:
        return False
    return True


def _line(kind: str, message: str, **extra: Any) -> bytes:
    return (json.dumps({"type": kind, "message": message, **extra}) + "\n").encode()


def build_engines_router(
    engines: EngineRegistry,
    before_uninstall: BeforeUninstall | None = None,
    extra_listen: Sequence[str] = (),
) -> APIRouter:
    router = APIRouter()

    @router.get("/engines/status")
    def engines_status() -> dict[str, str]:
        return {name: engine.status().describe(name) for name, engine in engines.items()}

    @router.get("/engines/info")
    def engines_info() -> dict[str, Any]:
        details = {}
        for engine in engines.values():
            status = engine.status()
            details[engine.name] = {
                "status": status.describe(engine.name),
                "state": status.state.value,
                "version": status.version,
                "detail": status.detail,
                "supported": is_supported_here(engine),
                "installable": can_install_here(engine),  # the dashboard offers Install only then
            }
        accelerator = detect_accelerator().to_json()
        return {
            "platform": platform_name(),
            "accelerator": accelerator,
            "engines": details,
            "extra_listen": list(extra_listen),
        }

    @router.post("/engines/install-backend")
    async def install_backend(
        body: InstallRequest = Depends(json_body(InstallRequest)),
    ) -> StreamingResponse:
        engine = engines.find(body.backend)
        if body.gpu not in GPU_KINDS:
            raise BadRequest(f"unknown gpu {body.gpu!r}: use one of {', '.join(GPU_KINDS)}")
        # Errors found before any work get a real status code; later ones end the stream with an error line.
        await asyncio.to_thread(engine.prepare_install, body.gpu, body.version)
        return StreamingResponse(
            _install_stream(engine.install, body.gpu, body.force, engine.name),
            media_type="application/x-ndjson",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @router.post("/engines/uninstall-backend")
    async def uninstall_backend(
        body: UninstallRequest = Depends(json_body(UninstallRequest)),
    ) -> dict[str, str]:
        engine = engines.find(body.backend)
        if before_uninstall is not None:
            await before_uninstall(engine.name)
        await asyncio.to_thread(engine.uninstall)
        status = await asyncio.to_thread(engine.status)
        if status.state is InstallState.RUNNING:
            message = f"{engine.name} was removed from the model runner's home; another one is still found"
        else:
            message = f"Uninstalled {engine.name}"
        return {"message": message, "status": status.describe(engine.name)}

    return router


async def _install_stream(
    install: Callable[..., Any], gpu: str, force: bool, name: str
) -> AsyncIterator[bytes]:
    """Run the install in a thread and relay its progress lines as they come.

    The install goes on if the client goes away: a half-copied engine helps nobody, and the build cache
    makes the next attempt cheap anyway.
    """
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[bytes | None] = asyncio.Queue()

    def progress(message: str) -> None:
        loop.call_soon_threadsafe(lines.put_nowait, _line("progress", message))

    def run() -> None:
        try:
            status = install(progress, gpu=gpu, force=force)
            final = _line("success", f"{name} is installed", status=status.describe(name))
        except ModelRunnerError as exc:
            final = _line("error", exc.message)
        except Exception as exc:  # a bug or an OS error: still end the stream with a line the CLI can show
            _log.exception("installing %s failed", name)  # the details may hold paths: log, don't send
            final = _line("error", f"installing {name} failed ({exc.__class__.__name__}); see the daemon log")
        loop.call_soon_threadsafe(lines.put_nowait, final)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=run, name=f"install-{name}", daemon=True).start()
    while (item := await lines.get()) is not None:
        yield item
