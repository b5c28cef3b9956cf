"""The one place errors become HTTP responses: OpenAI-style JSON bodies saying what to do.

Failures that are not a ModelRunnerError are answered in the same shape, never as a bare text 500: a full
disk is a 507 "no space left on device"; anything else a 500 whose traceback goes to the daemon log only.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from modelrunner.errors import ModelRunnerError, StorageFull
from modelrunner.eventlog import event
from modelrunner.server.proxy import App, Message, Receive, Scope, Send

log = logging.getLogger(__name__)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    412: "precondition_failed",
    413: "request_too_large",
    422: "unsupported_media_type",
    503: "service_unavailable",
    507: "insufficient_storage",
}


class InternalError(ModelRunnerError):
    status_code = 500


def unexpected_error(exc: Exception, method: str, path: str) -> ModelRunnerError:
    """What to answer for an exception no route turned into a ModelRunnerError, with its log line."""
    if isinstance(exc, ModelRunnerError):
        return exc
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        event(log, "storage_full", logging.ERROR, method=method, path=path, error=exc.strerror)
        return StorageFull(
            "no space left on device: free disk space where the models are stored (MODELS_PATH), "
            "then try again"
        )
    fields = {"method": method, "path": path, "error": type(exc).__name__}
    log.error("internal_error", exc_info=exc, extra={"fields": fields})
    name = type(exc).__name__
    return InternalError(f"internal error ({name}); the daemon log has the details (model logs)")


def error_body(status: int, message: str) -> dict[str, object]:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "code": status}}


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


def error_route_class(render: Callable[[int, str], Response]) -> type[APIRoute]:
    """A route class whose routes answer a ModelRunnerError with `render(status, message)`: the error
    shape of a compatible API (Ollama's, Anthropic's) instead of the OpenAI-style one."""

    class ErrorShapedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                try:
                    return await handler(request)
                except (StarletteHTTPException, RequestValidationError):
                    raise  # the app's handlers answer these
                except Exception as exc:
                    error = unexpected_error(exc, request.method, request.url.path)
                    return render(error.status_code, error.message)

            return guarded

    return ErrorShapedRoute


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return "invalid request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    async def on_model_runner_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ModelRunnerError)
        return error_response(exc.status_code, exc.message)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(400, _validation_message(exc))

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(exc.status_code, str(exc.detail))

    app.add_exception_handler(ModelRunnerError, on_model_runner_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_middleware(UnexpectedErrors)  # inside Starlette's outer error middleware, which would answer text


class UnexpectedErrors:
    """Answers any other exception of a route in the JSON shape (507 for a full disk, else 500), once, with
    a log line; an exception after the response started can only end it (and is logged)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            error = unexpected_error(exc, scope.get("method", ""), scope.get("path", ""))
            if not started:
                await error_response(error.status_code, error.message)(scope, receive, send)
