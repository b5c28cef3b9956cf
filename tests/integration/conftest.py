from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import Daemon, free_port
from tests.models import write_tiny_gguf


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = Daemon(tmp_path / "home", free_port()).start()
    yield running
    running.stop()


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf")
