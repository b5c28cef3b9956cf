"""The HTTP front's two decisions: which requests it answers itself, and where an engine's body ends."""

from __future__ import annotations

import importlib.metadata
import inspect
import tomllib
from pathlib import Path

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from modelrunner.server.front import UVICORN_TESTED, FastPath
from modelrunner.server.inference import InferenceHandler
from modelrunner.server.lifecycle import Lifecycle
from modelrunner.server.proxy import EVENT_STREAM_HEADERS, client_headers
from modelrunner.server.security import SecurityPolicy

PLAIN = (
    b"POST /engines/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:12434\r\n"
    b"Content-Type: application/json\r\nContent-Length: 42"
)


def fast(policy: SecurityPolicy | None = None) -> FastPath:
    # accept() looks at the head only; the handler and the lifecycle are not called
    handler = InferenceHandler.__new__(InferenceHandler)
    return FastPath(handler, policy or SecurityPolicy(), Lifecycle.__new__(Lifecycle))


def test_a_plain_inference_request_is_taken() -> None:
    request = fast().accept(PLAIN)
    assert request is not None
    assert request.route.upstream_path == "/v1/chat/completions" and request.content_length == 42
    assert (b"content-type", b"application/json") in request.headers and not request.close
    closing = fast().accept(PLAIN + b"\r\nConnection: close")
    assert closing is not None and closing.close


@pytest.mark.parametrize(
    "path", [b"/v1/chat/completions", b"/engines/llama.cpp/v1/completions", b"/v1/embeddings?x=1", b"/rerank"]
)
def test_every_inference_route_is_taken(path: bytes) -> None:
    head = PLAIN.replace(b"/engines/v1/chat/completions", path)
    assert fast().accept(head) is not None


@pytest.mark.parametrize(
    "head",
    [
        PLAIN.replace(b"POST", b"GET"),
        PLAIN.replace(b"HTTP/1.1", b"HTTP/1.0"),
        PLAIN.replace(b"/engines/v1/chat/completions", b"/models"),
        PLAIN.replace(b"/engines/v1/chat/completions", b"/v1/messages"),  # Anthropic: its own errors
        PLAIN.replace(b"chat/completions", b"chat%2Fcompletions"),
        PLAIN.replace(b"Content-Length: 42", b"Transfer-Encoding: chunked"),
        PLAIN.replace(b"Content-Length: 42", b"Content-Length: -1"),
        PLAIN.replace(b"Content-Length: 42", b"Content-Length: 10485761"),  # over the limit: 413 there
        PLAIN + b"\r\nContent-Length: 42",  # repeated
        PLAIN + b"\r\nOrigin: http://localhost:3000",  # CORS is the middleware's
        PLAIN + b"\r\nExpect: 100-continue",
        PLAIN + b"\r\nX-Preload-Only: true",
        PLAIN + b"\r\nConnection: upgrade",
        PLAIN + b"\r\n folded-continuation",
        PLAIN + b"\r\nBad Name: x",
        PLAIN + b"\r\n: no name",
        PLAIN + b"\r\nAccept: a\nX-Injected: 1",  # a bare LF would be a header line to the engine
        PLAIN + b"\r\nAccept: a\x00b",
        PLAIN.replace(b"127.0.0.1:12434", b"evil.example.com"),  # refused there with 403
        PLAIN.replace(b"Host: 127.0.0.1:12434", b"Host: "),  # HTTP/1.1 without a Host: 400 there
        PLAIN.replace(b"Host: 127.0.0.1:12434\r\n", b""),
        b"POST  /v1/chat/completions HTTP/1.1\r\nContent-Length: 1",
        b"\x00\xff garbage",
    ],
)
def test_anything_else_goes_to_the_asgi_stack(head: bytes) -> None:
    assert fast().accept(head) is None


def test_with_an_api_key_only_requests_that_carry_it_are_taken() -> None:
    keyed = fast(SecurityPolicy(api_key="s3cret"))
    assert keyed.accept(PLAIN) is None  # refused with 401 by the middleware
    assert keyed.accept(PLAIN + b"\r\nAuthorization: Bearer s3cret") is not None
    assert keyed.accept(PLAIN + b"\r\nx-api-key: s3cret") is not None
    assert keyed.accept(PLAIN + b"\r\nx-api-key: wrong") is None


def test_uvicorn_is_a_release_the_front_was_tested_with() -> None:
    """front.py builds uvicorn's protocol classes itself: an upgrade nobody tested fails here (and the pin
    in pyproject.toml keeps installs to the tested releases)."""
    version = importlib.metadata.version("uvicorn")
    assert version.startswith(UVICORN_TESTED), f"uvicorn {version} is not one the front was tested with"
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    [pin] = [d for d in pyproject["project"]["dependencies"] if d.startswith("uvicorn")]
    assert pin.replace(" ", "") == "uvicorn[standard]>=0.54.0,<0.55", pin
    # what the front uses of uvicorn's internals
    server_state = ServerState()
    assert isinstance(server_state.connections, set) and isinstance(server_state.tasks, set)
    assert isinstance(server_state.default_headers, list)
    parameters = list(inspect.signature(HttpToolsProtocol.__init__).parameters)
    assert parameters[:5] == ["self", "config", "server_state", "app_state", "_loop"]


def test_the_client_gets_the_engines_headers_less_the_dropped_ones() -> None:
    engine = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"transfer-encoding", b"chunked"),
        (b"connection", b"keep-alive"),
        (b"server", b"llama.cpp"),
        (b"date", b"Tue, 01 Dec 2026 00:00:00 GMT"),
        (b"access-control-allow-origin", b"*"),
    ]
    # the front passes the body on as framed: the engine's Transfer-Encoding with it
    framed, streaming = client_headers(engine, reframed=False)
    assert streaming and framed == [*engine[:2], *EVENT_STREAM_HEADERS]
    reframed, _ = client_headers(engine)  # the ASGI relay: uvicorn frames the data anew
    assert reframed == [engine[0], *EVENT_STREAM_HEADERS]
