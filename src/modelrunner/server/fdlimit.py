"""File descriptors: the daemon's limit, and how many client connections it admits within it.

A soft RLIMIT_NOFILE of 1024 (or less) is common, and a relayed stream holds up to 4 descriptors; past
the limit, accept() and engine connections fail with EMFILE and clients see closed connections or
misleading 502s. So the soft limit is raised to the hard one at start (as Go programs, DMR among them, do),
and the HTTP front admits connections while their descriptors fit with room to spare; one more is
answered 503 with Retry-After (server/front.py).
"""

from __future__ import annotations

import contextlib
import resource

FDS_PER_CONNECTION = 4  # the client's, the engine's, and the C relay's pair while it streams
HEADROOM = 64  # log files, the store, engine pipes, and the refusals being written
RETRY_AFTER = 1  # seconds: connections end all the time


def raise_nofile_limit() -> int:
    """Raise the soft limit on open files to the hard one (as far as the kernel allows); the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:  # not a value the soft limit may take: the kernel's ceiling
        try:
            with open("/proc/sys/fs/nr_open") as handle:
                target = int(handle.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        # refused: the limit stays, and max_connections() keeps the connections within it
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def max_connections() -> int:
    """Client connections the current soft limit has descriptors for, with the headroom kept free."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, (soft - HEADROOM) // FDS_PER_CONNECTION)
