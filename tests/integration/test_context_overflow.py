"""A prompt over the model's context (the tiny model's: 512 tokens), refused by llama-server before it
evaluates anything, reaches every API's client as a 400 in that API's words (compat/context_overflow.py),
streamed or not, through the HTTP front's byte relay and through the ASGI relay."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.daemon import Daemon
from tests.engines import tiny_daemon

LONG = "hello world " * 600  # well over 512 tokens with any tokenizer
ANTHROPIC_WORDS = re.compile(r"prompt is too long: (\d+) tokens > 512 maximum")
OPENAI_WORDS = re.compile(
    r"This model's maximum context length is 512 tokens\. However, your messages resulted in (\d+) tokens"
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path_factory.mktemp("overflow"), llama_server) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_prompt_is_too_long(daemon: Daemon, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": LONG}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            with client.messages.stream(model="tiny", max_tokens=4, messages=messages) as events:
                list(events)
        else:
            client.messages.create(model="tiny", max_tokens=4, messages=messages)
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    match = ANTHROPIC_WORDS.fullmatch(error["message"])
    assert match is not None and int(match.group(1)) > 512


def _openai_overflow(call: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    assert caught.value.code == "context_length_exceeded"
    match = OPENAI_WORDS.match(caught.value.body["message"])  # type: ignore[index]
    assert match is not None and int(match.group(1)) > 512


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_and_completions(daemon: Daemon, stream: bool) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": LONG}]
    _openai_overflow(
        lambda: (
            list(client.chat.completions.create(model="tiny", messages=messages, stream=stream))
            if stream
            else client.chat.completions.create(model="tiny", messages=messages)
        )
    )
    _openai_overflow(
        lambda: client.completions.create(model="tiny", prompt=LONG, max_tokens=4, stream=stream)
    )


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses(daemon: Daemon, stream: bool) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    _openai_overflow(
        lambda: client.responses.create(model="tiny", input=LONG, max_output_tokens=4, stream=stream)
    )


def test_the_asgi_relay_rewords_too(daemon: Daemon) -> None:
    """A target with a percent-escape is handed to uvicorn (server/front.py): the ASGI relay answers it."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": LONG}], "stream": True}
    answer = daemon.http("POST", "/v1/chat/completions?via=%61sgi", json=body, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and OPENAI_WORDS.match(error["message"])


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_chat(daemon: Daemon, stream: bool) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": LONG}], "stream": stream}
    answer = httpx.post(daemon.url + "/api/chat", json=body, timeout=60)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("the input length exceeds the context length (")


def test_a_prompt_that_fits_is_answered_after(daemon: Daemon) -> None:
    """The refusals left the runner and the kept-alive engine connections usable."""
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    for stream in (True, False):
        answer = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=stream
        )
        if stream:
            assert any(chunk.choices for chunk in answer)  # type: ignore[union-attr]
        else:
            assert answer.choices  # type: ignore[union-attr]
