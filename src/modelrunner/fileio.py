"""File primitives: atomic writes, safe opening of user files, hashing while copying."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from modelrunner.errors import BadRequest

CHUNK = 4 * 1024 * 1024


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_file_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    write_stream_atomic(path, [data], mode)


def write_stream_atomic(path: Path, chunks: Iterable[bytes], mode: int = 0o644) -> None:
    """temp file in the same folder -> fsync -> chmod (0644 unless told) -> rename: readers never see half
    a file, and content that fails midway (an interrupted export) never replaces the old file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def link_or_copy(source: Path, dest: Path) -> None:
    """Hard-link `source` to `dest` (its folder made), or copy it, mode kept, where links cannot be made."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except OSError as exc:  # another filesystem, or links not allowed: copy instead
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(source, dest)


def require_regular_file(path: Path, what: str = "file") -> os.stat_result:
    """stat a user-given path, refusing anything but a regular file, with a message naming it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadRequest(f"{what} not found: {path.name}") from None
    except OSError as exc:
        raise BadRequest(f"cannot read {what} {path.name}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"{what} {path.name} is a directory, a file is expected")
    if not stat.S_ISREG(st.st_mode):
        raise BadRequest(f"{what} {path.name} is not a regular file")
    return st


def open_regular_file(path: Path, what: str = "file") -> int:
    """Open a user-given path for reading, refusing anything but a regular file.

    O_NONBLOCK keeps a FIFO swapped in after the stat from blocking the open; fstat then checks the
    file actually opened. Returns a raw file descriptor.
    """
    require_regular_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise BadRequest(f"cannot read {what} {path.name}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadRequest(f"{what} {path.name} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_chunks(fd: int) -> Iterator[bytes]:
    while chunk := os.read(fd, CHUNK):
        yield chunk


def hash_file(path: Path, what: str = "file") -> tuple[str, int]:
    """sha256 digest and size of a regular file, read once."""
    fd = open_regular_file(path, what)
    digest = hashlib.sha256()
    size = 0
    try:
        for chunk in _read_chunks(fd):
            digest.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return "sha256:" + digest.hexdigest(), size


def copy_and_hash(source: Path, dest: Path, what: str = "file") -> tuple[str, int]:
    """Copy `source` to `dest` while hashing it, in one read pass.

    Hashing and writing overlap: while the main thread hashes chunk N, a writer thread writes chunk N-1
    (both release the GIL), so the copy costs about max(hash, write) rather than their sum.
    """
    fd = open_regular_file(source, what)
    digest = hashlib.sha256()
    size = 0
    try:
        out_file = open(dest, "xb", buffering=0)  # noqa: SIM115 - closed by the with below
    except BaseException:
        os.close(fd)
        raise
    try:
        with out_file as out, ThreadPoolExecutor(max_workers=1) as writer:
            pending = None
            for chunk in _read_chunks(fd):
                if pending is not None:
                    pending.result()
                pending = writer.submit(write_all, out.fileno(), chunk)
                digest.update(chunk)
                size += len(chunk)
            if pending is not None:
                pending.result()
            os.fsync(out.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise
    finally:
        os.close(fd)
    return "sha256:" + digest.hexdigest(), size
