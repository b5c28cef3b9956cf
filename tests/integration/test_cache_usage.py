"""Usage tells the truth about the prefix cache in every API family, from llama-server's own numbers, through
the official clients: a request repeated with the same prompt reports its cached part (Anthropic
`cache_read_input_tokens` with `input_tokens` the uncached rest, OpenAI chat and completions
`prompt_tokens_details.cached_tokens`, Responses `input_tokens_details.cached_tokens`), and the totals
agree across families (Ollama's `prompt_eval_count` counts the whole prompt, as Ollama's does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.daemon import Daemon
from tests.engines import tiny_daemon

SYSTEM = "Be brief."
GREEDY: Any = {"temperature": 0, "top_k": 1}
CHAT: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path_factory.mktemp("cache-usage"), llama_server) as running:
        yield running


@pytest.fixture(scope="module")
def oai(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused", max_retries=0)


def chat_usage(oai: openai.OpenAI) -> Any:
    return oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, extra_body=GREEDY).usage


def test_chat_reports_the_cached_part_of_a_repeated_prompt(oai: openai.OpenAI) -> None:
    chat_usage(oai)
    usage = chat_usage(oai)
    cached = usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < usage.prompt_tokens  # the last token is always evaluated again
    chunks = oai.chat.completions.create(
        model="tiny",
        messages=CHAT,
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=GREEDY,
    )
    [streamed] = [chunk.usage for chunk in chunks if chunk.usage is not None]
    assert streamed.prompt_tokens_details and streamed.prompt_tokens_details.cached_tokens == cached


def test_completions_report_the_cached_part(oai: openai.OpenAI) -> None:
    prompt = "Once upon a time there was a"
    oai.completions.create(model="tiny", prompt=prompt, max_tokens=2, extra_body=GREEDY)
    usage = oai.completions.create(model="tiny", prompt=prompt, max_tokens=2, extra_body=GREEDY).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert 0 < (usage.prompt_tokens_details.cached_tokens or 0) < usage.prompt_tokens


def test_responses_and_ollama_count_as_chat_does(daemon: Daemon, oai: openai.OpenAI) -> None:
    chat = chat_usage(oai)
    response = oai.responses.create(
        model="tiny", instructions=SYSTEM, input="hi", max_output_tokens=2, extra_body=GREEDY
    )
    assert response.usage is not None
    assert response.usage.input_tokens == chat.prompt_tokens
    assert 0 < response.usage.input_tokens_details.cached_tokens < chat.prompt_tokens
    body = {"model": "tiny", "messages": CHAT, "stream": False, "options": {"num_predict": 2, **GREEDY}}
    ollama = daemon.http("POST", "/api/chat", json=body).json()
    assert ollama["prompt_eval_count"] == chat.prompt_tokens


def test_anthropic_input_tokens_are_the_uncached_part(daemon: Daemon) -> None:
    client = anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)
    request: Any = {"model": "tiny", "system": SYSTEM, "messages": CHAT[1:]}
    total = client.messages.count_tokens(**request).input_tokens
    for _ in range(2):
        usage = client.messages.create(**request, max_tokens=2, extra_body=GREEDY).usage
    assert 0 < (usage.cache_read_input_tokens or 0) < total
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == total
    with client.messages.stream(**request, max_tokens=2, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message().usage
    assert streamed.input_tokens + (streamed.cache_read_input_tokens or 0) == total
