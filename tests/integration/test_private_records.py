"""What was asked and answered (`GET /engines/requests`, and its follow mode) and the logs (`GET /logs`) are
served to the daemon's own user only: another local user (uid 65534, with setpriv) gets a 403 in the
route's error shape saying why. With an API key in force the key decides, as on every route."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.daemon import error_message
from tests.fake_engine import FakeEngine
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf
from tests.users import request_as_other_user

PROMPT = "the daemon user's own question"
PRIVATE: tuple[tuple[str, dict[str, str]], ...] = (  # a path and the headers asked with
    ("/engines/requests", {}),
    ("/engines/requests?include_existing=true", {"Accept": "text/event-stream"}),
    ("/logs", {}),
    ("/logs?follow=true", {}),
)

Start = Callable[[], InProcessDaemon]


@pytest.fixture
def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Start]:
    """A daemon (scripted engine) whose user, root, has asked the tiny model something."""
    home = tmp_path / "home"
    monkeypatch.setenv("MODEL_RUNNER_HOME", str(home))
    started: list[InProcessDaemon] = []

    def starter() -> InProcessDaemon:
        daemon = InProcessDaemon(home, {"llama.cpp": FakeEngine()}).start()
        started.append(daemon)
        key = {"Authorization": "Bearer s3cret"}
        gguf = str(write_tiny_gguf(tmp_path / "tiny.gguf"))
        packaged = daemon.http("POST", "/models/package", json={"target": "tiny", "gguf": gguf}, headers=key)
        assert packaged.status_code == 201, packaged.text
        chat = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
        answered = daemon.http("POST", "/engines/v1/chat/completions", json=chat, headers=key)
        assert answered.status_code == 200, answered.text
        return daemon

    yield starter
    for daemon in started:
        daemon.stop()


def first_bytes(daemon: InProcessDaemon, path: str, headers: dict[str, str], until: str) -> tuple[int, str]:
    """Status and the start of a (maybe followed) answer: read until `until` shows, then let go."""
    with httpx.stream("GET", daemon.url + path, headers=headers, timeout=30) as response:
        text = ""
        for chunk in response.iter_text():
            text += chunk
            if until in text:
                break
        return response.status_code, text


def test_another_user_reads_no_prompt_answer_or_log(start: Start) -> None:
    daemon = start()
    for path, headers in PRIVATE:
        status, body = request_as_other_user("GET", daemon.url + path, headers=headers)
        assert status == 403, (path, body)
        message = body  # http.Error's text, as DMR's routes answer
        assert "only to the user the model runner runs as" in message and "MODEL_RUNNER_API_KEY" in message
        assert PROMPT not in body

    # the daemon's user reads them all
    listing = daemon.http("GET", "/engines/requests")
    assert listing.status_code == 200 and PROMPT in listing.text
    for path, headers in PRIVATE[1:]:
        until = PROMPT if path.startswith("/engines/") else "\n"
        status, text = first_bytes(daemon, path, headers, until)
        assert status == 200 and until in text, (path, text)


def test_with_an_api_key_the_key_decides(start: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_RUNNER_API_KEY", "s3cret")
    daemon = start()
    for path, headers in PRIVATE:
        status, body = request_as_other_user("GET", daemon.url + path, headers=headers)
        assert status == 401, (path, body)
        status, body = request_as_other_user(
            "GET", daemon.url + path, headers={**headers, "Authorization": "Bearer s3cret"}
        )
        assert status == 200, (path, body)
    refused = daemon.http("GET", "/logs")
    assert refused.status_code == 401 and error_message(refused) == "missing or wrong API key"
