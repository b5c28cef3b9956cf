"""The runtime directory: runners' sockets and pid records, private to the daemon's user.

Its name is predictable (it must be: a restarted daemon finds what a killed one left there), so on a host
shared with other users someone else may have made it first, or put a link or a socket of theirs in it.
The directory is used only when it is this user's own and nobody else may write in it; files in it are
created with O_EXCL | O_NOFOLLOW and read with O_NOFOLLOW; an engine's socket is connected to only when it
is this user's, in such a directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from modelrunner.errors import ModelRunnerError

MAX_SOCKET_PATH = 107  # bytes of a Unix socket path (sun_path), its terminating NUL left out
SOCKET_NAME_ROOM = len("/runner-1234567.sock")


class UnsafeRuntimeDir(ModelRunnerError):
    """The runtime directory is not the daemon's user's own, or others may write in it."""


def runtime_dir(home: Path) -> Path:
    """Where the runners of the daemon of runner home `home` keep their sockets: in $XDG_RUNTIME_DIR (the
    user's own, made by the login manager) when it is set and short enough for socket paths, else in the
    temporary folder. Derived from the home, so a restarted daemon finds what its predecessor left."""
    name = f"modelrunner-{os.getuid()}-{hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]}"
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if base and os.path.isabs(base):
        candidate = Path(base) / name
        if len(os.fsencode(candidate)) + SOCKET_NAME_ROOM <= MAX_SOCKET_PATH:
            return candidate
    return Path(tempfile.gettempdir()) / name


def ensure_private_dir(path: Path) -> Path:
    """Make `path` (mode 0700), or check the one there: a directory, not a link, owned by this user, that
    nobody else may write in (one only others may read is closed to them: they could not have written in
    it). UnsafeRuntimeDir otherwise, saying what to do."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UnsafeRuntimeDir(f"cannot use the runtime directory {path}: {exc.strerror}") from None
    problem = None
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    else:
        problem = not_private(st)
    if problem is not None:
        raise UnsafeRuntimeDir(
            f"refusing the runtime directory {path}: it {problem}; another user may have made it. "
            "Remove it, or set XDG_RUNTIME_DIR to a directory of your own"
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def not_private(st: os.stat_result, root_too: bool = False) -> str | None:
    """Why a file or directory others could change must not be relied on: it belongs to another user (root
    is accepted where `root_too`: root may change anything anyway), or others may write in it; None when it
    is this user's own."""
    uid = os.geteuid()
    if st.st_uid != uid and not (root_too and st.st_uid == 0):
        return f"belongs to uid {st.st_uid}, not to this user (uid {uid})"
    if st.st_mode & 0o022:
        return f"may be written by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def write_private_file(path: Path, data: bytes) -> None:
    """Create `path` afresh (mode 0600) and write `data`: whatever was there, a link included, is replaced,
    never followed."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def read_private_file(path: Path) -> bytes:
    """The content of the regular file `path`; OSError for a link (not followed) or anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        return handle.read()


def untrusted_socket(path: Path) -> str | None:
    """Why the engine socket `path` must not be connected to (it, or its directory, is another user's, or
    others may write in its directory), or None. A socket not there raises FileNotFoundError, as a connect
    would: connecting anyway could reach a socket put there after this check."""
    uid = os.geteuid()
    try:
        st = os.lstat(path)
        folder = os.stat(path.parent)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return f"the engine's socket cannot be checked: {exc.strerror}"
    if not stat.S_ISSOCK(st.st_mode):
        return "the engine's socket is not a socket"
    if st.st_uid != uid:
        return f"the engine's socket belongs to uid {st.st_uid}, not to the model runner's user"
    if folder.st_uid != uid or folder.st_mode & 0o022:
        return "the engine's socket is in a directory other users may write in"
    return None
