"""File primitives: atomic writes, safe opening of user files, hashing while copying."""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import queue
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from modelrunner.errors import BadRequest

CHUNK = 4 * 1024 * 1024
# Long writes ask the kernel to start writing to the disk every this many bytes, so that the data reaches the
# disk while the rest still arrives and the closing fsync has little left to wait for.
WRITEBACK_STEP = 32 * 1024 * 1024
_SYNC_FILE_RANGE_WRITE = 2
# HashingWriter writes chunks smaller than this itself: they come from a producer slower than the hash and
# the write together (a network read that found this much waiting), where a hand-over to the worker costs
# more than the overlap saves.
INLINE_WRITE_BELOW = 256 * 1024
WRITE_QUEUE = 4  # chunks a HashingWriter lets wait for its worker
# copy_file_range errors that mean "not between these two files": copy with reads and writes instead.
_NO_KERNEL_COPY = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.EPERM, errno.EBADF}
)


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


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux only; loaded on first use: ctypes is no import for a CLI to pay)."""
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing `length` bytes at `offset` of the file to the disk, without waiting for it.

    Only a head start: durability still comes from the fsync before the rename. Does nothing where the
    system has no sync_file_range.
    """
    function = _sync_file_range()
    if function is not None and length > 0:
        function(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


class HashingWriter:
    """Appends chunks to an open file (at its current offset, `position`) while hashing them.

    The caller hashes each chunk while a worker thread writes it (both release the GIL), so a chunk costs
    about max(hash, write) instead of their sum. Up to WRITE_QUEUE chunks may wait for the worker: on a
    shared machine the caller then goes on receiving and hashing instead of waiting for the worker to be
    scheduled after every chunk. A chunk under INLINE_WRITE_BELOW that finds no write waiting is written by
    the caller itself (a hand-over would cost more than it saves). Every WRITEBACK_STEP bytes the disk's
    writeback is started. Chunks are bytes, never changed after they are handed in. Leaving the `with`
    block waits for every write, so whatever was handed in is in the file (not yet fsynced) even on an
    error; the first failed write raises, from `write()` or from the end of the block.
    """

    def __init__(self, fd: int, hasher: Any, position: int) -> None:
        self.fd = fd
        self.hasher = hasher
        self.position = position
        self._flushed = position
        self._pending: collections.deque[Future[None]] = collections.deque()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blob-write")

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            while self._pending:
                pending = self._pending.popleft()
                if kind is None:
                    pending.result()
                else:  # already failing: let the writes finish, keep the first error
                    with contextlib.suppress(Exception):
                        pending.result()
        finally:
            self._worker.shutdown()

    def write(self, chunk: bytes) -> None:
        pending = self._pending
        while pending and (len(pending) >= WRITE_QUEUE or pending[0].done()):
            pending.popleft().result()  # a failed write raises here
        start = self.position
        self.position += len(chunk)
        writeback_from = -1
        if self.position - self._flushed >= WRITEBACK_STEP:
            writeback_from, self._flushed = self._flushed, start
        if not pending and len(chunk) < INLINE_WRITE_BELOW:
            self._write(chunk, writeback_from, start)
        else:
            pending.append(self._worker.submit(self._write, chunk, writeback_from, start))
        self.hasher.update(chunk)

    def _write(self, chunk: bytes, writeback_from: int, start: int) -> None:
        write_all(self.fd, chunk)
        if writeback_from >= 0:  # what was written before this chunk
            start_writeback(self.fd, writeback_from, start - writeback_from)


def hash_file(path: Path, what: str = "file") -> tuple[str, int]:
    """sha256 digest and size of a regular file, read once (into one reused buffer)."""
    fd = open_regular_file(path, what)
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(CHUNK))
    size = 0
    try:
        while n := os.readv(fd, [buffer]):
            digest.update(buffer[:n])
            size += n
    finally:
        os.close(fd)
    return "sha256:" + digest.hexdigest(), size


def copy_and_hash(source: Path, dest: Path, what: str = "file") -> tuple[str, int]:
    """Copy `source` to a new file `dest` (fsynced) and return the copy's sha256 digest and size.

    The kernel copies (`copy_file_range`: a reflink where the file system shares extents, else one copy
    inside the kernel, no bytes through Python) in a worker thread, while this thread hashes what the
    worker has already placed in `dest`, read back from the page cache. Hashing the copy rather than the
    source means the digest is that of the stored bytes even if the user's file changes meanwhile. Where
    the kernel cannot copy between the two files, the rest goes through one read and one write per chunk.
    """
    fd = open_regular_file(source, what)
    try:
        out = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(out, fcntl.LOCK_EX)  # while it is written: a store's clean-up of partials leaves it
    except BaseException:
        os.close(fd)
        raise
    try:
        hasher = hashlib.sha256()
        size = _kernel_copy_hashed(fd, out, hasher)
        size = _copy_rest_hashed(fd, out, hasher, size)
        os.fsync(out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise
    finally:
        os.close(out)
        os.close(fd)
    return "sha256:" + hasher.hexdigest(), size


def _copy_range(source: int, dest: int, offset: int, length: int) -> int:
    """copy_file_range of up to `length` bytes at `offset` in both files; fewer only at the source's end.
    Starts the writeback of the copy every WRITEBACK_STEP bytes."""
    done = 0
    while done < length:
        n = os.copy_file_range(source, dest, length - done, offset + done, offset + done)
        if n == 0:
            break
        done += n
    end = offset + done
    if end // WRITEBACK_STEP != offset // WRITEBACK_STEP:
        step_start = end // WRITEBACK_STEP * WRITEBACK_STEP
        start_writeback(dest, step_start - WRITEBACK_STEP, WRITEBACK_STEP)
    return done


def _kernel_copy_hashed(source: int, dest: int, hasher: Any) -> int:
    """Copy with copy_file_range in a worker, hashing each chunk from `dest` behind it.

    The worker copies chunk after chunk without waiting for the hash, and says how much each copy placed
    (a queue): the copy (~0.3 s per GiB here) runs ahead of the hash (~0.65 s), which never waits for it
    after the first chunk. (Handing over one chunk at a time made the hash wait for every copy: 0.26 s of
    a GiB's 0.93 s, bench/RESULTS.md "package".) Returns the bytes copied and hashed: the whole file, or
    a prefix (0 where the kernel cannot copy between these files), which the caller completes with plain
    reads and writes.
    """
    placed: queue.SimpleQueue[int | OSError] = queue.SimpleQueue()
    stop = threading.Event()

    def copy_all() -> None:
        position = 0
        while not stop.is_set():
            try:
                copied = _copy_range(source, dest, position, CHUNK)
            except OSError as exc:
                placed.put(exc)
                return
            placed.put(copied)
            if copied < CHUNK:
                return
            position += copied

    buffer = memoryview(bytearray(CHUNK))
    position = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="copy") as worker:
        worker.submit(copy_all)
        try:
            while True:
                copied = placed.get()
                if isinstance(copied, OSError):
                    if position == 0 and copied.errno in _NO_KERNEL_COPY:
                        return 0
                    raise copied
                chunk = buffer[:copied]
                if os.preadv(dest, [chunk], position) != copied:
                    raise OSError(errno.EIO, "the copy is shorter than what was copied into it")
                hasher.update(chunk)
                position += copied
                if copied < CHUNK:
                    return position
        finally:
            stop.set()  # the worker ends at its next chunk; the executor waits for it


def _copy_rest_hashed(source: int, dest: int, hasher: Any, position: int) -> int:
    """Copy from `position` to the end of `source` with reads and writes, hashing what is written."""
    os.lseek(dest, position, os.SEEK_SET)
    with HashingWriter(dest, hasher, position) as writer:
        while chunk := os.pread(source, CHUNK, writer.position):
            writer.write(chunk)
        return writer.position
