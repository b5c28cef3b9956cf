"""Just enough HTTP/1.1 for client.py: one request per connection, over TCP, a Unix socket or TLS, and the
answer read as it arrives (by Content-Length, chunked, or up to the close) with the one response reader
(response_reader.py).

The standard library's http.client would do, but importing it loads the email package and ssl, which
cost more than the rest of `model ls` talking to a local daemon; here ssl is loaded only by the caller
that speaks TLS. The interface is the part of http.client's that client.py uses (`status`, `getheader`,
`read`, `read1`, `readline`, iteration by lines), so that client.py stays the one place that knows the
daemon's API. Requests are sent as http.client sends them (the same Host, Accept-Encoding and framing).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from modelrunner.response_reader import ResponseReader, body_of

if TYPE_CHECKING:
    import ssl

READ_SIZE = 64 * 1024


class ProtocolError(OSError):
    """The other side closed the connection early, or answered with something that is not HTTP/1.x."""


def connect(
    host: str,
    port: int,
    timeout: float,
    *,
    unix_path: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> socket.socket:
    """A connected socket to `unix_path`, else to host:port (wrapped in TLS when `tls` is given)."""
    if unix_path is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(unix_path)
        except OSError:
            sock.close()
            raise
        return sock
    # bytes, so that resolving an ASCII name does not load the idna codec (as a str host would)
    name = host.encode("ascii") if host.isascii() else host.encode("idna")
    sock = socket.create_connection((name, port), timeout)  # type: ignore[arg-type]
    if tls is None:
        return sock
    try:
        return tls.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def host_header(host: str, port: int, default_port: int) -> str:
    """The Host header http.client sends: IPv6 in brackets, the port only when it is not the default."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == default_port else f"{shown}:{port}"


def _check_text(text: str, what: str) -> None:
    if any(char in text for char in "\r\n\0") or (what == "request target" and " " in text):
        raise ValueError(f"invalid {what}: {text!r}")


def send_request(
    sock: socket.socket,
    method: str,
    target: str,
    host: str,
    headers: dict[str, str],
    body: bytes | Iterable[bytes] | None,
) -> None:
    """Write the request: a bytes body with its Content-Length (with the head, in one send), any other
    iterable chunked; POST, PUT and PATCH without a body say Content-Length: 0, as http.client does."""
    _check_text(target, "request target")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    names = {name.lower() for name in headers}
    if "content-length" not in names and "transfer-encoding" not in names:
        if isinstance(body, bytes):
            lines.append(f"Content-Length: {len(body)}")
        elif body is not None:
            lines.append("Transfer-Encoding: chunked")
        elif method in ("POST", "PUT", "PATCH"):
            lines.append("Content-Length: 0")
    for name, value in headers.items():
        _check_text(name, "header name")
        _check_text(value, "header value")
        lines.append(f"{name}: {value}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if body is None or isinstance(body, bytes):
        sock.sendall(head + (body or b""))
        return
    sock.sendall(head)
    for chunk in body:
        if chunk:  # an empty chunk would end the body
            sock.sendall(f"{len(chunk):X}\r\n".encode() + chunk + b"\r\n")
    sock.sendall(b"0\r\n\r\n")


class Response:
    """An answer being read from its connection, which it owns and closes once the body has been read (or
    when closed early)."""

    def __init__(self, sock: socket.socket, method: str) -> None:
        self._sock = sock
        self._reader = ResponseReader(no_body=method == "HEAD")  # interim (1xx) answers are passed over
        self._pending = b""  # body bytes already taken off the wire, not yet returned
        self._done = False
        try:
            first = b""  # the answer's first bytes, to show if they are not HTTP
            while (head := self._reader.head) is None:
                data = self._sock.recv(READ_SIZE)
                if not data:
                    where = "in the middle of the answer's headers" if first else "without an answer"
                    raise ProtocolError(f"the connection was closed {where}")
                first = first or data
                spans = self._reader.feed(data)
                if self._reader.invalid is not None and self._reader.head is None:
                    raise ProtocolError(f"the answer is not HTTP ({self._reader.invalid}): {first[:80]!r}")
            self.status, self.reason = head.status, head.reason.decode("latin-1")
            self._headers = [
                (name.decode("latin-1"), value.decode("latin-1")) for name, value in head.headers
            ]
            self._pending = body_of(spans, data)
            if self._reader.complete:
                self._finish()
        except BaseException:
            self.close()
            raise

    def getheader(self, name: str, default: str | None = None) -> str | None:
        """A header's value (repeated ones joined with ", ", as http.client joins them), else `default`."""
        wanted = name.lower()
        values = [value for key, value in self._headers if key == wanted]
        return ", ".join(values) if values else default

    def _read_some(self, amount: int = READ_SIZE) -> bytes:
        """The next body bytes that have arrived (at most `amount`; waits for one); b"" at the end."""
        reader = self._reader
        while not self._done:
            if reader.invalid is not None:  # after the whole chunks before the invalid bytes
                raise ProtocolError(f"the answer's body is invalid: {reader.invalid}")
            if reader.complete:
                self._finish()
                break
            data = self._sock.recv(amount)
            if not data:
                if reader.feed_eof():  # neither length nor chunks: the body ends with the connection
                    self._finish()
                    break
                if reader.chunked:
                    raise ProtocolError("the connection was closed in the middle of the answer")
                raise ProtocolError(
                    f"the connection was closed {reader.remaining} bytes before the end of the answer"
                )
            if out := body_of(reader.feed(data), data):
                return out
        return b""

    def read(self, amount: int | None = None) -> bytes:
        """The rest of the body, or `amount` bytes of it (fewer only at its end)."""
        parts = [self._pending]
        have = len(self._pending)
        while amount is None or have < amount:
            data = self._read_some(READ_SIZE if amount is None else max(amount - have, 0) or READ_SIZE)
            if not data:
                break
            parts.append(data)
            have += len(data)
        data = b"".join(parts)
        if amount is None:
            self._pending = b""
            return data
        self._pending = data[amount:]
        return data[:amount]

    def read1(self, amount: int = READ_SIZE) -> bytes:
        """What has arrived, at most `amount` bytes, waiting only when nothing has; b"" at the end."""
        if self._pending:
            data, self._pending = self._pending[:amount], self._pending[amount:]
            return data
        return self._read_some(amount)

    def readline(self) -> bytes:
        """The next line of the body, with its b"\\n" (without one only at the end)."""
        while b"\n" not in self._pending:
            data = self._read_some()
            if not data:
                line, self._pending = self._pending, b""
                return line
            self._pending += data
        line, _, self._pending = self._pending.partition(b"\n")
        return line + b"\n"

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def _finish(self) -> None:
        self._done = True
        self.close()  # one request per connection: the connection is not reused

    def close(self) -> None:
        self._done = True
        self._sock.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
