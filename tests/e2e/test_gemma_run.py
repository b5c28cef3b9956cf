"""The quickstart's last step with the real engine and the real Gemma 3 270M: `model run` prints text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import Daemon, free_port

TEMPLATE = Path(__file__).resolve().parents[2] / "src" / "modelrunner" / "templates" / "gemma3.jinja"


@pytest.fixture
def gemma_daemon(
    tmp_path: Path, gemma_gguf: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Daemon]:
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    daemon = Daemon(tmp_path / "home", free_port()).start()
    daemon.cli(
        "package",
        "--gguf",
        str(gemma_gguf),
        "--chat-template",
        str(TEMPLATE),
        "--context-size",
        "2048",
        "gemma3:270m",
    )
    yield daemon
    daemon.stop()


def test_model_run_prints_generated_text(gemma_daemon: Daemon) -> None:
    out = gemma_daemon.cli(
        "run", "gemma3:270m", "--max-tokens", "32", "Write one sentence about the sea."
    ).stdout
    assert len(out.strip()) > 0


def test_completion_continues_text(gemma_daemon: Daemon) -> None:
    body = {"model": "gemma3:270m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    answer = gemma_daemon.http("POST", "/v1/completions", json=body).json()
    assert answer["usage"]["completion_tokens"] > 0
    assert answer["model"] == "gemma3:270m"
    assert answer["choices"][0]["text"].strip()


def test_memory_estimate_is_close_to_the_resident_set(gemma_daemon: Daemon) -> None:
    gemma_daemon.http(
        "POST", "/v1/completions", json={"model": "gemma3:270m", "prompt": "Hi", "max_tokens": 2}
    )
    [runner] = gemma_daemon.http("GET", "/engines/ps").json()
    rss = int(Path(f"/proc/{runner['pid']}/statm").read_text().split()[1]) * 4096
    assert 0.5 < runner["memory_estimate"] / rss < 2.0
