"""The HTTP front keeps a request's state in one object that ends with it (server/front.py `Answering`):
nothing of an answer, such as the early head of a stream that waited, shapes what the connection says
next."""

from __future__ import annotations

import json
import socket

import pytest

from modelrunner.server import front, handed_over, keepalive
from tests.conformance.dmr_daemons import FakeDaemons


def _read_chunked_answer(sock: socket.socket) -> bytes:
    answer = b""
    while not answer.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(65536)
        assert chunk, answer
        answer += chunk
    return answer


def test_after_a_stream_with_an_early_head_a_stalled_request_gets_its_408(
    fake_daemons: FakeDaemons, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(keepalive.ENV, "0.2")
    monkeypatch.setattr(front, "REQUEST_STALL_SECONDS", 0.5)
    daemon = fake_daemons.start({"FAKE_START_DELAY": "1", "FAKE_TEXT": "hello"})  # the load: pings
    data = json.dumps({"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(data), data.encode())
    )
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        sock.sendall(request)
        streamed = _read_chunked_answer(sock)
        assert keepalive.SSE_COMMENT in streamed and b"data: [DONE]" in streamed  # it had an early head
        sock.sendall(request[:40])  # the next request stops coming
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert json.loads(body)["error"]["message"] == handed_over.STALLED
