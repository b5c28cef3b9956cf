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
