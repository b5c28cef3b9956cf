"""client_errors.py: each failure the daemon answers becomes the DaemonError subclass of its kind, with the
status, message and request id it came with (what the CLI prints depends on those, not on the class)."""

from __future__ import annotations

import json

import pytest

from modelrunner import client_errors as ce
from modelrunner import errors
from modelrunner.errors import DaemonError


def body(message: str, status: int) -> bytes:
    return json.dumps({"error": {"message": message, "code": status}}).encode()


@pytest.mark.parametrize(
    ("status", "path", "kind"),
    [
        (400, "/engines/_configure", ce.BadRequest),
        (401, "/models", ce.Unauthorized),
        (403, "/models/package", ce.PermissionDenied),
        (404, "/models/ai/nosuch", ce.ModelNotFound),
        (404, "/engines/v1/models/ai/nosuch", ce.ModelNotFound),
        (404, "/engines/nosuch/v1/chat/completions", ce.NotFound),
        (409, "/models/ai/tiny", ce.Conflict),
        (412, "/engines/v1/chat/completions", ce.EngineNotInstalled),
        (507, "/models/create", ce.InsufficientStorage),
        (500, "/models", DaemonError),
        (502, "/engines/v1/chat/completions", DaemonError),
    ],
)
def test_each_status_is_its_kind(status: int, path: str, kind: type[DaemonError]) -> None:
    error = ce.daemon_error(status, body("what went wrong", status), path, request_id="rid-1")
    assert type(error) is kind
    assert (error.status_code, error.message, error.request_id) == (status, "what went wrong", "rid-1")


def test_a_client_error_is_also_the_servers_error_of_that_kind() -> None:
    error = ce.daemon_error(404, body("model not found", 404), "/models/x")
    assert isinstance(error, errors.ModelNotFound) and isinstance(error, errors.NotFound)
    assert isinstance(ce.daemon_error(412, b"", "/engines/v1/x"), errors.EngineNotInstalled)
    assert error.status_code == 404  # its own status, not the class's


def test_busy_says_how_long_to_wait_when_the_daemon_does() -> None:
    busy = ce.daemon_error(503, body("too many requests waiting", 503), "/v1/chat/completions", None, " 5 ")
    assert isinstance(busy, ce.Busy) and busy.retry_after == 5
    for retry_after in (None, "soon", "-1"):
        unsure = ce.daemon_error(503, b"", "/v1/chat/completions", retry_after=retry_after)
        assert isinstance(unsure, ce.Busy) and unsure.retry_after is None


def test_the_message_is_the_bodys_else_the_status() -> None:
    assert ce.daemon_error(404, b'{"error": "ollama says"}', "/api/x").message == "ollama says"
    assert ce.daemon_error(502, b"", "/x").message == "HTTP 502"
    assert ce.daemon_error(401, body("no key", 401), "/x", message="set the key").message == "set the key"
