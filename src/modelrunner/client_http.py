"""Just enough HTTP/1.1 for client.py: one request per connection, over TCP, a Unix socket or TLS, and the
answer read as it arrives (by Content-Length, chunked, or up to the close).

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

from modelrunner.chunking import chunk_size

if TYPE_CHECKING:
    import ssl

READ_SIZE = 64 * 1024
MAX_LINE = 64 * 1024  # the longest status, header or chunk-size line accepted
MAX_HEADERS = 200


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
        self._file = sock.makefile("rb")
        self._pending = b""  # body bytes already taken off the wire, not yet returned
        self._done = False
        try:
            while True:
                self.status, self.reason = self._status_line()
                self._headers = self._header_lines()
                if not 100 <= self.status < 200:
                    break  # 100 Continue and other interim answers are skipped, as http.client does
            coding = (self.getheader("Transfer-Encoding") or "").lower()
            self._chunked = coding.rsplit(",", 1)[-1].strip() == "chunked"
            self._chunk_left = 0  # of the current chunk
            self._chunk_crlf = False  # the CRLF after a chunk's data is still to be read
            self._left: int | None = None  # body bytes to come, when a Content-Length says so
            length = self.getheader("Content-Length")
            if not self._chunked and length is not None and length.strip().isdigit():
                self._left = int(length)
            if method == "HEAD" or self.status in (204, 304):
                self._left, self._chunked = 0, False
            if self._left == 0:
                self._finish()
        except BaseException:
            self.close()
            raise

    def _line(self) -> bytes:
        line = self._file.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError("the answer has a line longer than 64 KiB")
        return line

    def _status_line(self) -> tuple[int, str]:
        line = self._line()
        if not line:
            raise ProtocolError("the connection was closed without an answer")
        parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise ProtocolError(f"the answer is not HTTP: {line[:80]!r}")
        return int(parts[1]), parts[2] if len(parts) > 2 else ""

    def _header_lines(self) -> list[tuple[str, str]]:
        headers: list[tuple[str, str]] = []
        while True:
            line = self._line()
            if not line:
                raise ProtocolError("the connection was closed in the middle of the answer's headers")
            if line in (b"\r\n", b"\n"):
                return headers
            if len(headers) >= MAX_HEADERS:
                raise ProtocolError(f"the answer has more than {MAX_HEADERS} headers")
            text = line.decode("latin-1").rstrip("\r\n")
            if text[:1] in (" ", "\t") and headers:  # an obsolete folded continuation line
                name, value = headers[-1]
                headers[-1] = (name, f"{value} {text.strip()}")
                continue
            name, colon, value = text.partition(":")
            if colon:
                headers.append((name.strip().lower(), value.strip()))

    def getheader(self, name: str, default: str | None = None) -> str | None:
        """A header's value (repeated ones joined with ", ", as http.client joins them), else `default`."""
        wanted = name.lower()
        values = [value for key, value in self._headers if key == wanted]
        return ", ".join(values) if values else default

    def _read_some(self, amount: int = READ_SIZE) -> bytes:
        """The next body bytes that have arrived (at most `amount`; waits for one); b"" at the end."""
        if self._done:
            return b""
        if self._chunked:
            if self._chunk_left == 0:
                if self._chunk_crlf and self._line() != b"\r\n":
                    raise ProtocolError("a chunk of the answer is longer than it said")
                size_line = self._line()
                try:
                    if not size_line.endswith(b"\r\n"):
                        raise ValueError("a chunk line does not end with CRLF")
                    self._chunk_left = chunk_size(size_line[:-2])
                except ValueError:
                    raise ProtocolError(f"the answer has an invalid chunk size: {size_line[:40]!r}") from None
                if self._chunk_left == 0:
                    while self._line() not in (b"\r\n", b"\n", b""):
                        pass  # trailers: nothing here needs them
                    self._finish()
                    return b""
            data = self._file.read1(min(amount, self._chunk_left))
            if not data:
                raise ProtocolError("the connection was closed in the middle of the answer")
            self._chunk_left -= len(data)
            self._chunk_crlf = self._chunk_left == 0
            return data
        if self._left is not None:
            data = self._file.read1(min(amount, self._left))
            if not data:
                raise ProtocolError(
                    f"the connection was closed {self._left} bytes before the end of the answer"
                )
            self._left -= len(data)
            if self._left == 0:
                self._finish()
            return data
        data = self._file.read1(amount)  # neither length nor chunks: the body ends with the connection
        if not data:
            self._finish()
        return data

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
        self._file.close()
        self._sock.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
