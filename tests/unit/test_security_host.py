"""The Host check (DNS rebinding): only local names, or those allowed, each with at most a port."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from modelrunner.server.proxy import Message
from modelrunner.server.security import SecurityMiddleware, SecurityPolicy


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.1:12434", "localhost:80", "[::1]", "[::1]:12434", "::1", "LOCALHOST"]
)
def test_local_hosts_are_allowed(host: str) -> None:
    assert SecurityPolicy().host_allowed(host)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "127.0.0.1:12434@evil.example",
        "localhost:80@evil.example",
        "[::1]:12434@evil.example",
        "[::1]evil.example",
        "127.0.0.1:",
        "127.0.0.1:\uff18\uff10",  # non-ASCII digits are no port
        "127.0.0.1@evil.example",
        "localhost:99999",  # no such port (issue 36 item 8)
        "localhost:0",
        "[::1]:65536",
        "localhost:" + "9" * 40,
    ],
)
def test_anything_after_the_port_is_refused(host: str) -> None:
    assert not SecurityPolicy().host_allowed(host)


async def _status(host: bytes) -> tuple[int, dict[str, Any]]:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a refused request must not reach the application")

    sent: list[Message] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "path": "/models",
        "headers": [(b"host", host)],
    }
    await SecurityMiddleware(app, SecurityPolicy())(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_a_host_with_a_trailing_name_gets_the_refusal_of_other_bad_hosts() -> None:
    expected = asyncio.run(_status(b"evil.example"))
    assert expected[0] == 403
    assert asyncio.run(_status(b"127.0.0.1:12434@evil.example")) == expected
