"""The daemon's failures as the client raises them: a DaemonError subclass per kind of failure, carrying the
daemon's request id (`X-Request-Id`, the id of its log lines), as huggingface_hub's `hf_raise_for_status`
maps a Hub answer to `RepositoryNotFoundError` and the like.

Each is also the server-side error of the same kind (`except errors.ModelNotFound` catches both), and keeps
the status and message it came with, so what the CLI prints does not depend on the class.
"""

from __future__ import annotations

from modelrunner import errors, wire
from modelrunner.errors import DaemonError


class Unreachable(DaemonError):
    """Nothing answered at the daemon's address (status 0)."""


class NotTheRunner(Unreachable):
    """Another program answers at the daemon's address (a web page where the API should be): no model
    runner answered, and starting one would not help (the port is taken)."""


class BadRequest(DaemonError, errors.BadRequest):
    pass


class Unauthorized(DaemonError):
    """The daemon's API key check refused the request, or a registry refused the daemon's credentials."""


class PermissionDenied(DaemonError, errors.PermissionDenied):
    pass


class NotFound(DaemonError, errors.NotFound):
    pass


class ModelNotFound(NotFound, errors.ModelNotFound):
    """A 404 of a route about one model (`/models/{name}...`, `/v1/models/{name}`)."""


class Conflict(DaemonError, errors.Conflict):
    pass


class EngineNotInstalled(DaemonError, errors.EngineNotInstalled):
    """The engine the request needs is not installed; the message says how to install it."""


class Busy(DaemonError):
    """The daemon cannot take the request now (its queue is full, an engine's cluster does not answer);
    `retry_after`: the seconds it asked the client to wait, when it said."""

    def __init__(
        self, status: int, message: str, request_id: str | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(status, message, request_id)
        self.retry_after = retry_after


class InsufficientStorage(DaemonError):
    """No room for the model: on disk, or in the memory its runner needs (507)."""


_BY_STATUS: dict[int, type[DaemonError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    412: EngineNotInstalled,
    503: Busy,
    507: InsufficientStorage,
}


def _names_a_model(path: str) -> bool:
    route = path.split("?", 1)[0]
    return route.startswith("/models/") or "/v1/models/" in route


def daemon_error(
    status: int,
    body: bytes,
    path: str,
    request_id: str | None = None,
    retry_after: str | None = None,
    message: str | None = None,
) -> DaemonError:
    """The error to raise for the daemon's answer `status` with `body` to a request for `path`; `message`,
    when given, replaces the body's."""
    text = message or wire.error_message(body) or f"HTTP {status}"
    kind = _BY_STATUS.get(status, DaemonError)
    if kind is NotFound and _names_a_model(path):
        kind = ModelNotFound
    if kind is Busy:
        wait = retry_after.strip() if retry_after else ""
        return Busy(status, text, request_id, int(wait) if wait.isdigit() else None)
    return kind(status, text, request_id)
