"""One way for a test to wait for something that happens in another process or thread.

No test asserts a duration: the timeout only bounds how long a broken run hangs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], what: str, timeout: float = 30, interval: float = 0.05) -> T:
    """Poll `check` until it returns a true value, and return that value; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
