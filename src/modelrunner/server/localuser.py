"""Whether a local caller is the daemon's own user: the only one for whom the daemon reads files by path.

`POST /models/package` makes the daemon read files named in the request. Any local user can reach a daemon
on loopback, so without this check the daemon would read, on anyone's behalf, what only its owner may read
(and then `export` it). A caller is the daemon's user (or root) when

* the client's end of its loopback TCP connection belongs to that uid: Linux lists every socket with its
  owner in /proc/net/tcp and /proc/net/tcp6 (the connection is found by its two addresses), or
* it sends the token from `<runner home>/daemon.token`, a file only the daemon's user can read (for
  connections that have no such owner to look up, e.g. a Unix socket). The CLI sends it.

Anyone else is refused, and `model package` then reads the files itself and uploads them (as it does for a
daemon on another machine), so nothing is read with more rights than the caller has.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
import sys
from pathlib import Path

TOKEN_HEADER = "x-model-runner-token"
_IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


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


def peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client end of the TCP connection client -> server on this machine, or None."""
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
            if len(fields) < 8:
                continue
            if _endpoint(fields[1]) == wanted_local and _endpoint(fields[2]) == wanted_remote:
                with contextlib.suppress(ValueError):
                    return int(fields[7])
    return None


def is_daemon_user(
    client: tuple[str, int] | None, server: tuple[str, int] | None, token_sent: str | None, token: str
) -> bool:
    if token_sent and hmac.compare_digest(token_sent.encode(), token.encode()):
        return True
    if client is None or server is None:
        return False
    uid = peer_uid(client, server)
    return uid is not None and uid in (os.geteuid(), 0)  # root may read anything anyway
