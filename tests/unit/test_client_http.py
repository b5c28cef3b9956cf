"""client_http, the CLI client's HTTP/1.1 transport, against a server that answers with scripted bytes: the
framings a server may choose (Content-Length, chunked, up to the close, none for HEAD/204), interim 1xx
answers, answers cut short, and the request bytes it sends. (The daemon itself is its peer in the CLI's
integration and conformance tests.)"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from modelrunner.client_http import ProtocolError, Response, connect, host_header, send_request

Script = Callable[[socket.socket, bytes], None]


def read_request(conn: socket.socket) -> bytes:
    """The request's head and its body (by Content-Length, or chunked up to the last chunk)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    if b"content-length:" in head:
        length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        while len(data) < len(head) + 4 + length:
            data += conn.recv(65536)
    elif b"transfer-encoding: chunked" in head:
        while not data.endswith(b"\r\n0\r\n\r\n") and not data.endswith(b"\r\n\r\n0\r\n\r\n"):
            data += conn.recv(65536)
    return data


class ScriptedServer:
    """One connection at a time on a loopback port: reads a request, runs the test's script on it."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.requests: list[bytes] = []
        self.script: Script = lambda conn, request: None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                request = read_request(conn)
                self.requests.append(request)
                self.script(conn, request)

    def request(self, method: str = "GET", body: bytes | list[bytes] | None = None) -> Response:
        sock = connect("127.0.0.1", self.port, 10)
        send_request(sock, method, "/path?q=1", host_header("127.0.0.1", self.port, 80), {"X-A": "b"}, body)
        return Response(sock, method)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    running = ScriptedServer()
    yield running
    running.listener.close()


def answer(raw: bytes) -> Script:
    return lambda conn, request: conn.sendall(raw)


def test_a_json_request_and_a_content_length_answer(server: ScriptedServer) -> None:
    server.script = answer(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    )
    with server.request("POST", b'{"a":1}') as response:
        assert (response.status, response.reason) == (200, "OK")
        assert response.getheader("content-type") == "application/json"
        assert response.getheader("X-Missing") is None
        assert response.read() == b"{}"
        assert response.read() == b""
    # as http.client sends it: Host with the port, Accept-Encoding, the length, then the caller's headers
    assert server.requests[0] == (
        b"POST /path?q=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept-Encoding: identity\r\n"
        b'Content-Length: 7\r\nX-A: b\r\n\r\n{"a":1}' % server.port
    )


def test_a_post_without_a_body_says_so(server: ScriptedServer) -> None:
    server.script = answer(b"HTTP/1.1 204 No Content\r\n\r\n")
    with server.request("POST") as response:
        assert response.status == 204 and response.read() == b""
    assert b"\r\nContent-Length: 0\r\n" in server.requests[0]


def test_chunked_answers_are_decoded_and_read_by_lines_across_chunks(server: ScriptedServer) -> None:
    server.script = answer(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4\r\n{"a"\r\n7;ext=1\r\n:1}\n{"b\r\n5\r\n":2}\n\r\n3\r\ntai\r\n0\r\nTrailer: x\r\n\r\n'
    )
    with server.request() as response:
        assert list(response) == [b'{"a":1}\n', b'{"b":2}\n', b"tai"]
        assert response.readline() == b""


def test_read_with_a_size_returns_that_many_until_the_end(server: ScriptedServer) -> None:
    server.script = answer(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    )
    with server.request() as response:
        assert response.readline() == b"abcdefg"  # no newline: the whole body
    with server.request() as response:
        assert [response.read(5), response.read(5), response.read(5)] == [b"abcde", b"fg", b""]


def test_an_answer_without_length_ends_with_the_connection(server: ScriptedServer) -> None:
    server.script = answer(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
    with server.request() as response:
        assert response.read() == b"all of it"


def test_interim_answers_are_skipped(server: ScriptedServer) -> None:
    server.script = answer(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    )
    with server.request("POST", b"x") as response:
        assert response.status == 201 and response.read() == b"ok"


def test_no_body_is_waited_for_after_head_or_204(server: ScriptedServer) -> None:
    def script(conn: socket.socket, request: bytes) -> None:
        status = b"200 OK" if request.startswith(b"HEAD") else b"204 No Content"
        conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 10\r\n\r\n")
        conn.recv(1)  # the connection stays open until the client closes it: reading must not wait

    server.script = script
    for method in ("HEAD", "GET"):
        with server.request(method) as response:  # its socket times out (a failure) if it waited
            assert response.read() == b""


def test_read1_returns_what_has_arrived(server: ScriptedServer) -> None:
    """`model logs -f` prints each piece as it comes: read1 must not wait for more than it has."""
    more = threading.Event()

    def script(conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        more.wait(30)
        conn.sendall(b"6\r\nsecond\r\n0\r\n\r\n")

    server.script = script
    with server.request() as response:
        assert response.read1(1024) == b"first"  # the server holds the rest back until this returned
        more.set()
        assert response.read1(1024) == b"second"
        assert response.read1(1024) == b""


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"", "closed without an answer"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n", "middle of the answer's headers"),
    ],
)
def test_what_is_not_an_answer_is_a_protocol_error(server: ScriptedServer, raw: bytes, problem: str) -> None:
    server.script = answer(raw)
    with pytest.raises(ProtocolError, match=problem):
        server.request()


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "5 bytes before the end"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nshort", "middle of the answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "invalid chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n", "invalid chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n", "does not end with CRLF"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXY0\r\n\r\n",
            "no CRLF after a chunk's data",
        ),
    ],
)
def test_a_body_cut_short_is_a_protocol_error(server: ScriptedServer, raw: bytes, problem: str) -> None:
    server.script = answer(raw)
    with server.request() as response, pytest.raises(ProtocolError, match=problem):
        response.read()
    assert isinstance(ProtocolError(), OSError)  # so client.py reports it as a broken connection


def test_an_iterable_body_is_sent_chunked(server: ScriptedServer) -> None:
    server.script = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    with server.request("POST", [b"tar", b"", b"ball" * 1000]) as response:
        assert response.read() == b""
    head, body = server.requests[0].split(b"\r\n\r\n", 1)
    assert b"\r\nTransfer-Encoding: chunked" in head
    assert body == b"3\r\ntar\r\nFA0\r\n" + b"ball" * 1000 + b"\r\n0\r\n\r\n"  # the empty piece is not sent


def test_repeated_and_folded_headers(server: ScriptedServer) -> None:
    server.script = answer(
        b"HTTP/1.1 200 OK\r\nVary: a\r\nX-Long: one\r\n two\r\nVary: b\r\nContent-Length: 0\r\n\r\n"
    )
    with server.request() as response:
        assert response.getheader("Vary") == "a, b"
        assert response.getheader("X-Long") == "one two"


@pytest.mark.parametrize(
    ("target", "headers"),
    [("/a b", {}), ("/a\r\nX: y", {}), ("/", {"X-Key": "k\r\nX-Injected: 1"}), ("/", {"X\nY": "1"})],
)
def test_what_cannot_be_sent_as_it_is_is_refused(target: str, headers: dict[str, str]) -> None:
    left, right = socket.socketpair()
    with left, right, pytest.raises(ValueError):
        send_request(left, "GET", target, "localhost", headers, None)


def test_host_header_as_http_client_writes_it() -> None:
    assert host_header("127.0.0.1", 80, 80) == "127.0.0.1"
    assert host_header("localhost", 12434, 80) == "localhost:12434"
    assert host_header("::1", 12434, 80) == "[::1]:12434"
    assert host_header("example.com", 443, 443) == "example.com"


def test_a_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "daemon.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                read_request(conn)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong")

        thread = threading.Thread(target=serve)
        thread.start()
        sock = connect("localhost", 80, 10, unix_path=path)
        send_request(sock, "GET", "/version", "localhost", {}, None)
        with Response(sock, "GET") as response:
            assert response.read() == b"pong"
        thread.join(10)
