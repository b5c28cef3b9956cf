"""A private network namespace with loopback only, for servers that listen on every interface.

Ray's processes (GCS, raylets, workers) bind all interfaces whatever `--node-ip-address` says, and Ray
replaces 127.0.0.1 by the machine's address; inside a namespace whose only interface is `lo`, everything a
test's Ray cluster does stays on loopback, and nothing of it is reachable from outside.

`with PrivateNetwork() as net:` moves the calling thread (pytest's main thread) into a new namespace made
by `unshare --net` (root only), so every process and connection the test makes in between is inside; on
exit the thread goes back and any process still in the namespace is killed (and reported).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def _namespace_of(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


class PrivateNetwork:
    def __init__(self) -> None:
        self.holder: subprocess.Popen[bytes] | None = None
        self.original: int | None = None
        self.inode: int | None = None
        self.leftovers: list[str] = []

    def __enter__(self) -> PrivateNetwork:
        if os.geteuid() != 0:
            raise RuntimeError(
                "a private network namespace (unshare --net) needs root; run the tests as root"
            )
        mine = _namespace_of("thread-self")
        self.holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"])
        deadline = time.monotonic() + 10
        while _namespace_of(self.holder.pid) in (None, mine):
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("unshare --net did not make a network namespace")
            time.sleep(0.01)
        self.inode = _namespace_of(self.holder.pid)
        self.original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/proc/{self.holder.pid}/ns/net", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        _loopback_up()
        return self

    def processes(self) -> list[int]:
        """Processes in the namespace other than its holder (ours, by construction)."""
        assert self.holder is not None
        skip = {self.holder.pid, os.getpid()}
        return [
            int(entry.name)
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit()
            and int(entry.name) not in skip
            and _namespace_of(entry.name) == self.inode
        ]

    def __exit__(self, *exc: object) -> None:
        if self.original is not None:
            _setns(self.original)
            os.close(self.original)
        deadline = time.monotonic() + 20
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.processes():
            with contextlib.suppress(OSError):
                self.leftovers.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
                os.kill(pid, signal.SIGKILL)
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
