"""The one exception hierarchy of modelrunner.

Every error carries the HTTP status it maps to; the server turns it into a JSON body in one place
(server/errors.py). Messages say what went wrong and what to do next, and never contain absolute paths.
"""

from __future__ import annotations

import errno
from typing import TypeGuard

_QUOTE_LIMIT = 60


def quote_input(text: str) -> str:
    """User input as a message shows it: escaped, and cut short so huge input is never echoed whole."""
    shown = ascii(text)
    return shown if len(shown) <= _QUOTE_LIMIT else shown[: _QUOTE_LIMIT - 3] + "..."


def status_line(status: int) -> str:
    """A status as Go's `resp.Status` writes it ("404 Not Found"), which DMR puts in its error messages (the
    CLI's and search's); the number alone for a status without a reason phrase."""
    from http import HTTPStatus  # start-up: every CLI command loads this module, only a failure needs this

    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


class ModelRunnerError(Exception):
    """Base class: a failure with a user-facing message and an HTTP status."""

    status_code = 500

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the request field at fault, for OpenAI's `error.param`


class BadRequest(ModelRunnerError):
    status_code = 400


class InvalidReference(BadRequest):
    """A model reference (name, tag, digest or ID) that cannot be parsed."""


class InvalidDigest(BadRequest):
    """A digest that is not `sha256:<64 lowercase hex>`."""


class InvalidModelFile(BadRequest):
    """A GGUF, safetensors or DDUF file that is malformed, truncated or hostile."""


class InvalidArtifact(BadRequest):
    """A manifest, config or archive that does not describe a valid model artifact."""


class PermissionDenied(ModelRunnerError):
    status_code = 403


class ModelNotFound(ModelRunnerError):
    status_code = 404


class NotFound(ModelRunnerError):
    status_code = 404


class MethodNotAllowed(ModelRunnerError):
    status_code = 405


class Conflict(ModelRunnerError):
    status_code = 409


class UnsupportedMediaType(ModelRunnerError):
    status_code = 422


class StoreCorrupted(ModelRunnerError):
    status_code = 500


class StorageFull(ModelRunnerError):
    """The disk (or quota) of the model store is full: HTTP 507, as DMR and WebDAV mean it."""

    status_code = 507


def is_no_space(exc: BaseException) -> TypeGuard[OSError]:
    """Whether an error is a full disk or quota (what StorageFull reports)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class DaemonError(ModelRunnerError):
    """Client side: the daemon answered with an error status, or could not be reached (status 0);
    `request_id` is the daemon's id of the request (its `X-Request-Id`), when it answered one. The client
    raises a subclass per kind of failure (client_errors.py)."""

    def __init__(self, status: int, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status
        self.request_id = request_id


class UnknownEngine(ModelRunnerError):
    """A backend name that no engine answers to (DMR: 404)."""

    status_code = 404


class EngineUnsupported(BadRequest):
    """An engine that cannot be installed here: wrong platform, or not available in modelrunner yet."""


class EngineNotInstalled(ModelRunnerError):
    """The engine a request needs is not installed; the message says how to install it."""

    status_code = 412


class EngineInstallError(ModelRunnerError):
    """Fetching, building or placing an engine failed."""


class EngineUnavailable(ModelRunnerError):
    """Something an engine needs beyond this machine (an RPC worker, a Ray cluster) does not answer or
    cannot hold the model now; the message names it."""

    status_code = 503
