"""The one place errors become HTTP responses: OpenAI-style JSON bodies saying what to do."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from modelrunner.errors import ModelRunnerError

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
}


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
                except ModelRunnerError as exc:
                    return render(exc.status_code, exc.message)

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
