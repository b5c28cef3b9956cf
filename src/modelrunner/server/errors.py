"""The one place errors become HTTP responses, in the shape of the API the request came to.

OpenAI-style `{"error": {"message", "type", "code"}}` for the OpenAI and Responses routes, Ollama's
`{"error": "..."}` under `/api/`, Anthropic's `{"type": "error", "error": {...}}` for Messages: whether
the error comes from a handler, from routing (404, 405 with `Allow`), from validation or from the
middleware (Host, API key, body limit). DMR's own routes (`/models`, `/engines/ps`, `_configure`, ...)
answer as DMR's handlers do, with net/http's http.Error: the message and a newline as plain text, which
DMR's CLI prints as it is (pkg/inference/models/http_handler.go, scheduling/http_handler.go); the
middleware's refusals, which DMR does not make, stay JSON there. Which API a path is: server/routes.py.

Failures that are not a ModelRunnerError are answered in the same shape, never as a bare text 500: a full
disk is a 507 "no space left on device"; anything else a 500 whose traceback goes to the daemon log only.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from modelrunner.compat import anthropic
from modelrunner.compat.context_overflow import OPENAI_CODE, ContextOverflow
from modelrunner.errors import ModelRunnerError, StorageFull, is_no_space
from modelrunner.eventlog import event
from modelrunner.server.proxy import App, Message, Receive, Scope, Send
from modelrunner.server.routes import ANTHROPIC, DMR, OLLAMA, api_family

# the families are the route table's (server/routes.py): callers that shape errors find them here too
from modelrunner.server.routes import OPENAI as OPENAI
from modelrunner.server.routes import RESPONSES as RESPONSES

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
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
    if is_no_space(exc):
        event(log, "storage_full", logging.ERROR, method=method, path=path, error=exc.strerror)
        return StorageFull(
            "no space left on device: free disk space where the models are stored (MODELS_PATH), "
            "then try again"
        )
    fields = {"method": method, "path": path, "error": type(exc).__name__}
    log.error("internal_error", exc_info=exc, extra={"fields": fields})
    name = type(exc).__name__
    return InternalError(f"internal error ({name}); the daemon log has the details (model logs)")


def error_body(status: int, message: str, param: str | None = None) -> dict[str, object]:
    error: dict[str, object] = {
        "message": message,
        "type": _TYPES.get(status, "server_error"),
        "code": status,
    }
    if param is not None:
        error["param"] = param
    return {"error": error}


def error_payload(family: str, status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an error in `family`'s shape (`param`, the field at fault: OpenAI's shape only)."""
    if family == OLLAMA:
        return {"error": message}
    if family == ANTHROPIC:
        return anthropic.error_body(status, message)
    return error_body(status, message, param)


def exception_payload(family: str, exc: ModelRunnerError) -> dict[str, Any]:
    """The JSON body of a refusal in `family`'s shape; a prompt over the context in the words that API's
    clients act on (compat/context_overflow.py)."""
    if not isinstance(exc, ContextOverflow):
        return error_payload(family, exc.status_code, exc.message, exc.param)
    if family == OLLAMA:
        return {"error": exc.ollama_message}
    if family == ANTHROPIC:
        return anthropic.error_body(exc.status_code, exc.anthropic_message)
    body = error_body(exc.status_code, exc.message, exc.param)
    error = body["error"]
    assert isinstance(error, dict)
    error["code"] = OPENAI_CODE
    return body


def error_response(
    status: int,
    message: str,
    family: str = DMR,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> Response:
    if family == DMR:
        return go_http_error(status, message, headers)
    return JSONResponse(error_payload(family, status, message, param), status_code=status, headers=headers)


def go_http_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """net/http's http.Error, as DMR's own routes answer every error: the message and a newline."""
    headers = {**(headers or {}), "X-Content-Type-Options": "nosniff"}
    return PlainTextResponse(message + "\n", status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return "invalid request: " + "; ".join(parts)


def allowed_methods(app: FastAPI, request: Request) -> str:
    """Every method some route of `app` takes for this path, for the `Allow` header of a 405 (HEAD
    wherever GET is: the lifecycle middleware serves it). Each method is tried against the routes, as
    routing would, whatever kind of route (included routers too) holds it."""
    # a fresh scope: the request's own holds what routing chose for it (FastAPI keeps that there)
    base = {key: request.scope[key] for key in ("type", "path", "root_path", "headers", "query_string")}
    allowed = [
        method
        for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
        if any(route.matches({**base, "method": method})[0] is Match.FULL for route in app.router.routes)
    ]
    if "GET" in allowed and "HEAD" not in allowed:
        allowed.insert(1, "HEAD")
    return ", ".join(allowed)


def install_error_handlers(app: FastAPI) -> None:
    async def on_model_runner_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ModelRunnerError)
        headers = {"Retry-After": str(exc.retry_after)} if hasattr(exc, "retry_after") else None
        family = api_family(request.url.path)
        if family == DMR:
            return go_http_error(exc.status_code, exc.message, headers)
        payload = exception_payload(family, exc)
        return JSONResponse(payload, status_code=exc.status_code, headers=headers)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(400, _validation_message(exc), api_family(request.url.path))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(app, request)
        family, detail = api_family(request.url.path), str(exc.detail)
        if family == DMR and exc.status_code == 404 and detail == "Not Found":
            detail = "404 page not found"  # a path no route takes: net/http's NotFound, as DMR's muxes
        return error_response(exc.status_code, detail, family, headers or None)

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
                family = api_family(scope.get("path", ""))
                await error_response(error.status_code, error.message, family)(scope, receive, send)
