from __future__ import annotations

from pathlib import Path

import pytest

from tests.models import write_tiny_gguf


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf")
