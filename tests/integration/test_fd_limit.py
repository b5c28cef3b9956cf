"""File descriptors (server/fdlimit.py): the daemon raises its soft limit to the hard one at start, and
beyond what its limit has room for, a connection is answered 503 with Retry-After, never closed silently."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon import Daemon, free_port

Start = Callable[[int, int], Daemon]  # (soft, hard) limits of open files: a started daemon


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    started: list[Daemon] = []

    def starter(soft: int, hard: int) -> Daemon:
        daemon = Daemon(tmp_path / "home", free_port(), nofile=(soft, hard))
        started.append(daemon.start())
        return daemon

    yield starter
    for daemon in started:
        daemon.stop()


def soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open files limit")


def test_the_soft_limit_is_raised_to_the_hard_one(start: Start) -> None:
    daemon = start(128, 4096)
    assert daemon.process is not None and soft_limit(daemon.process.pid) == 4096


def answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + length(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_connections_beyond_the_limit_get_503_and_retry_after(start: Start) -> None:
    daemon = start(160, 160)
    request = f"GET /version HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n\r\n".encode()
    clients: list[socket.socket] = []
    try:
        for _ in range(300):  # every connection open at once, the admitted ones kept alive
            # each asks at once, as clients do: a refused one is closed once its request is read, or after
            # front.REFUSED_LINGER; a request sent after that close would get a reset that drops the 503
            client = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
            clients.append(client)
            client.sendall(request)
        statuses = []
        for index, client in enumerate(clients):
            try:
                data = answer(client)
            except ConnectionResetError:
                raise AssertionError(f"connection {index} was reset without an answer") from None
            head, _, body = data.partition(b"\r\n\r\n")
            assert data, "a connection closed without an answer"
            status = int(head.split(b" ")[1])
            statuses.append(status)
            if status == 503:
                assert b"\r\nretry-after: 1" in head.lower()
                error = json.loads(body)["error"]
                assert error["code"] == 503 and error["type"] == "service_unavailable"
            else:
                assert status == 200, data
    finally:
        for client in clients:
            client.close()
    assert 200 in statuses and 503 in statuses
    assert "reason=file_descriptors" in (daemon.home / "logs" / "daemon.log").read_text()


def test_streams_beyond_the_limit_get_503_never_a_502_or_a_silent_close(
    start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36 item 7: 300 streamed chats at once with a hard limit of 256 open files. A stream holds the
    client's descriptor, its engine connection's and the relay's, so only some fit: those are answered in
    full, every other one a 503 with Retry-After; none a 502 or 500 (an engine connection or the store's
    files failing for want of descriptors) and none closed unanswered. The engine is the relay benchmark's
    stand-in llama-server (bench/standin_engine.py), streaming 20 chunks 0.2 s apart."""
    import sys
    import threading

    from tests.models import write_tiny_gguf

    wrapper = tmp_path / "llama-server"
    standin = Path(__file__).resolve().parents[2] / "bench" / "standin_engine.py"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {standin} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("STANDIN_STEP_MS", "200")  # read by the engine the daemon starts
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(wrapper))
    daemon = start(256, 256)
    daemon.cli("package", "--gguf", str(write_tiny_gguf(tmp_path / "tiny.gguf")), "tiny")
    body = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True}
    ).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    outcomes: list[str] = []

    def stream() -> None:
        try:
            with socket.create_connection(("127.0.0.1", daemon.port), timeout=120) as client:
                client.sendall(request)
                data = b""
                while chunk := client.recv(65536):
                    data += chunk
        except OSError as exc:
            outcomes.append(type(exc).__name__)
            return
        if not data:
            outcomes.append("closed unanswered")
        elif data.startswith(b"HTTP/1.1 503 ") and b"\r\nretry-after: 1\r\n" in data.lower():
            outcomes.append("503")
        elif data.startswith(b"HTTP/1.1 200 ") and b"data: [DONE]" in data:  # the whole stream
            outcomes.append("200")
        else:
            outcomes.append(data[:12].decode("latin-1"))

    threads = [threading.Thread(target=stream) for _ in range(300)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert len(outcomes) == 300 and set(outcomes) == {"200", "503"}, sorted(set(outcomes))
    assert "Too many open files" not in (daemon.home / "logs" / "daemon.log").read_text()
