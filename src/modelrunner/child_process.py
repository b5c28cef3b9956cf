"""What a child process runs before it becomes an engine or a worker: it ends with its parent."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int) -> Callable[[], None]:
    """SIGTERM to the child when its parent (the daemon, `model worker`) dies, so that a `kill -9` of the
    parent does not leave the child (and its memory) behind. libc is found here, before the fork: the child
    only calls it."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm
