"""The daemon process fixtures (a plugin of tests/conftest.py): `daemons`, the factory that stops every
daemon it started at the test's end, and `daemon`, one started with no model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import Daemon, Daemons


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    started = Daemons(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture
def daemon(daemons: Daemons) -> Daemon:
    """A daemon process under tmp_path/home with no model, stopped at the end."""
    return daemons.start()
