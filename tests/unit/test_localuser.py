"""server/localuser.py: who is on the other end of a loopback connection, and the daemon's token."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.server.localuser import ensure_token, is_daemon_user, peer_uid, unix_peer_uid


@pytest.fixture(params=[("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)])
def connection(request: pytest.FixtureRequest) -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """A real loopback TCP connection: (the client's address, the server's address)."""
    host, family = request.param
    with socket.socket(family) as server:
        server.bind((host, 0))
        server.listen()
        with socket.socket(family) as client:
            client.connect(server.getsockname()[:2])
            accepted, peer = server.accept()
            with accepted:
                yield peer[:2], accepted.getsockname()[:2]


def test_the_peer_of_a_loopback_connection_is_found_with_its_uid(
    connection: tuple[tuple[str, int], tuple[str, int]],
) -> None:
    client, server = connection
    assert peer_uid(client, server) == os.geteuid()
    assert is_daemon_user(client, server, None, "token")


def test_an_unknown_connection_has_no_peer(connection: tuple[tuple[str, int], tuple[str, int]]) -> None:
    client, server = connection
    assert peer_uid(client, (server[0], 1)) is None
    assert peer_uid(("not an address", 1), server) is None
    assert not is_daemon_user(client, (server[0], 1), None, "token")


def test_a_closed_connection_has_no_peer() -> None:
    """What remains of a connection once its client closed it is listed as uid 0: that is not root."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.create_connection(server.getsockname())
        accepted, peer = server.accept()
        with accepted:
            client.close()
            assert peer_uid(peer, accepted.getsockname()) is None
            assert not is_daemon_user(peer, accepted.getsockname(), None, "token")


def test_the_token_proves_the_user_where_the_connection_cannot() -> None:
    assert is_daemon_user(None, None, "s3cret", "s3cret")
    assert not is_daemon_user(None, None, "guess", "s3cret")
    assert not is_daemon_user(None, None, None, "s3cret")
    assert not is_daemon_user(None, None, "", "s3cret")


def test_on_tcp_the_connection_decides_and_a_token_counts_for_nothing(
    connection: tuple[tuple[str, int], tuple[str, int]],
) -> None:
    """A token leaked to another user must not let it in: where the peer can be looked up, it decides."""
    client, server = connection
    assert not is_daemon_user(client, (server[0], 1), "s3cret", "s3cret")


def test_the_listener_of_a_unix_socket_is_known() -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right, socket.socket() as tcp:
        assert unix_peer_uid(left) == os.geteuid()
        assert unix_peer_uid(tcp) is None


def test_the_token_file_is_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "home" / "daemon.token"
    token = ensure_token(path)
    assert len(token) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # someone loosened it: put right, same token
    assert ensure_token(path) == token and stat.S_IMODE(path.stat().st_mode) == 0o600
