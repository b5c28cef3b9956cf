"""A retry finds its cache (scheduler/conversations.py), on a real llama-server with SmolLM2 (quantized):
a streamed request whose client gives up during the prefill is sent again at once, as Claude Code and
OpenCode do; the retry waits for the engine to finish the abandoned batch, so the engine puts it on the slot
holding the tokens done so far and its usage reports them cached. Without the wait it landed on another
slot (llama-server picks among idle slots only) and its prefill started from zero. Chat completions and
Anthropic Messages (which llama-server translates itself, so no slot can be named in the body)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelrunner.embedded import smollm2_gguf
from tests.daemon import Daemon, parse_logfmt
from tests.engines import llama_daemon

pytestmark = pytest.mark.integration

# ~3,000 tokens: a first batch (2,048) takes seconds on this CPU, the whole prefill longer still
LINES = "\n".join(
    f"def step_{i}(x):  # step {i} of the pipeline\n    return x * {i} + {i % 7}" for i in range(150)
)
GREEDY: Any = {"temperature": 0, "top_k": 1}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with llama_daemon(tmp_path_factory.mktemp("retry-cache"), llama_server) as running:
        running.cli("package", "--gguf", str(smollm2_gguf()), "smol")
        loaded = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert running.http("POST", "/engines/v1/chat/completions", json=loaded).status_code == 200
        yield running


def give_up_during_prefill(daemon: Daemon, path: str, body: dict[str, Any]) -> None:
    """Send the request, streamed, and close the connection 4 s later, during its prefill (a first batch
    of 2,048 tokens takes longer than that here)."""
    raw = json.dumps({**body, "stream": True}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", daemon.port)) as client:
        client.sendall(f"{head}Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        time.sleep(4)


def waits(daemon: Daemon) -> list[dict[str, str]]:
    lines = daemon.log.read_text().splitlines()
    return [parse_logfmt(line) for line in lines if "event=waited_for_abandoned" in line]


@pytest.mark.parametrize(
    ("path", "body", "cached"),
    [
        (
            "/engines/v1/chat/completions",
            {"model": "smol", "messages": [{"role": "user", "content": LINES + "\nSummarise."}], **GREEDY},
            lambda answer: answer["usage"]["prompt_tokens_details"]["cached_tokens"],
        ),
        (
            "/anthropic/v1/messages",
            {
                "model": "smol",
                "system": "Be brief.",
                "messages": [{"role": "user", "content": LINES}],
                **GREEDY,
            },
            lambda answer: answer["usage"]["cache_read_input_tokens"],
        ),
    ],
    ids=["chat", "anthropic"],
)
def test_a_retry_after_the_client_gave_up_reuses_the_abandoned_prefill(
    daemon: Daemon, path: str, body: dict[str, Any], cached: Any
) -> None:
    body = {**body, "max_tokens": 1, "messages": [{**body["messages"][0], "content": f"{path}\n{LINES}"}]}
    before = len(waits(daemon))
    give_up_during_prefill(daemon, path, body)
    retry = daemon.http("POST", path, json=body, timeout=300)
    assert retry.status_code == 200, retry.text
    assert cached(retry.json()) >= 512  # at least the abandoned request's first batch
    [waited] = waits(daemon)[before:]
    assert waited["engine_working"] == "0"  # it waited until the engine had let the abandoned one go


def test_a_new_conversation_does_not_wait(daemon: Daemon) -> None:
    body = {"model": "smol", "messages": [{"role": "user", "content": "left\n" + LINES}], "max_tokens": 1}
    before = len(waits(daemon))
    give_up_during_prefill(daemon, "/engines/v1/chat/completions", body)
    other = {**body, "messages": [{"role": "user", "content": "Say hi."}]}
    assert daemon.http("POST", "/engines/v1/chat/completions", json=other).status_code == 200
    assert waits(daemon)[before:] == []
