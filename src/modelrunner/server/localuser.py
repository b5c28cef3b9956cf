"""Whether a local caller is the daemon's own user: the only one for whom the daemon reads files by path
(`POST /models/package`) and shows what was asked and answered (`GET /engines/requests`, `GET /logs`).

Any local user can reach a daemon on loopback, so without this check the daemon would read, on anyone's
behalf, what only its owner may read (and then `export` it), and show everyone its owner's prompts. A caller
is the daemon's user (or root) when

* on a TCP connection: the client's end belongs to that uid. Linux lists every socket with its owner in
  /proc/net/tcp and /proc/net/tcp6 (the connection is found by its two addresses). A token sent over TCP
  counts for nothing: a token that leaked to another user must not let that user in.
* on a connection with no such owner to look up (a Unix socket): it sends the token from
  `<runner home>/daemon.token`, a file only the daemon's user can read. The CLI sends it there, and only to
  a listener of its own user (SO_PEERCRED), never over TCP: a listener of another user on the daemon's
  port would get it.

Anyone else is refused, and `model package` then reads the files itself and uploads them (as it does for a
daemon on another machine), so nothing is read with more rights than the caller has.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
import socket
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TOKEN_HEADER = "x-model-runner-token"
_IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# The states in which a socket's owner is still the one who opened it: once closed, what remains of a
# connection (TIME_WAIT, or FIN_WAIT2 after a close) is listed as uid 0, and would pass for root.
_OPEN_STATES = ("01", "03")  # ESTABLISHED, SYN_RECV


def ensure_token(path: Path) -> str:
    """The daemon's token, created (mode 0600) on first use; its mode is put right if it was changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path.read_text().strip()


def _address(hex_text: str) -> _IpAddress:
    """An address as /proc/net/tcp* prints it: 32-bit words in the machine's byte order."""
    words = (hex_text[i : i + 8] for i in range(0, len(hex_text), 8))
    raw = b"".join(int(word, 16).to_bytes(4, sys.byteorder) for word in words)
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _endpoint(text: str) -> tuple[_IpAddress, int] | None:
    host, _, port = text.partition(":")
    try:
        return _address(host), int(port, 16)
    except ValueError:
        return None


def _normalised(host: str, port: int) -> tuple[_IpAddress, int] | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address, port


def _client_end(client: tuple[str, int], server: tuple[str, int]) -> list[str] | None:
    """The /proc/net/tcp* fields of the client end of the TCP connection client -> server on this machine."""
    wanted_local, wanted_remote = _normalised(*client), _normalised(*server)
    if wanted_local is None or wanted_remote is None:
        return None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            if _endpoint(fields[1]) == wanted_local and _endpoint(fields[2]) == wanted_remote:
                return fields
    return None


def peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client end of the open TCP connection client -> server on this machine, or None."""
    fields = _client_end(client, server)
    if fields is None or fields[3] not in _OPEN_STATES:
        return None
    with contextlib.suppress(ValueError):
        return int(fields[7])
    return None


def client_holds_socket(client: tuple[str, int], server: tuple[str, int]) -> bool:
    """Whether the client end of the connection client -> server is a socket on this machine that a process
    still holds: after it shuts its side (a half-close) it does; once it closes the socket, Linux lists the
    orphaned end with inode 0, then not at all. False for a client on another machine."""
    fields = _client_end(client, server)
    return fields is not None and fields[9] != "0"


def is_daemon_user(
    client: tuple[str, int] | None, server: tuple[str, int] | None, token_sent: str | None, token: str
) -> bool:
    if client is not None and _normalised(*client) is not None:  # TCP: the connection says who it is
        uid = peer_uid(client, server) if server is not None else None
        return uid is not None and uid in (os.geteuid(), 0)  # root may read anything anyway
    return bool(token_sent) and hmac.compare_digest((token_sent or "").encode(), token.encode())


def caller_is_daemon_user(scope: Mapping[str, Any], token: str) -> bool:
    """`is_daemon_user` for an ASGI request: its connection's two addresses (the transport's own: the daemon
    trusts no X-Forwarded-For, see server/daemon.py) and the token it sent."""
    client, server = scope.get("client"), scope.get("server")
    name = TOKEN_HEADER.encode()
    sent = next((value.decode("latin-1") for key, value in scope["headers"] if key.lower() == name), None)
    return is_daemon_user(
        (str(client[0]), int(client[1])) if client else None,
        (str(server[0]), int(server[1])) if server and server[1] is not None else None,
        sent,
        token,
    )


def unix_peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process listening at the other end of a connected Unix socket (SO_PEERCRED), or None
    for any other socket."""
    if sock.family != socket.AF_UNIX:
        return None
    pid_uid_gid = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", pid_uid_gid)[1])
