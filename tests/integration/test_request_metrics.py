"""The daemon's request metrics on `/metrics` (server/request_metrics.py) against a real daemon, the built
llama-server and the tiny GGUF, driven by the official clients: requests by status class, durations, first
bytes and first tokens, tokens as each answer counted them, and the scheduler's gauges; label values come
from the store, never from what a client typed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon import Daemon
from tests.engines import tiny_daemon
from tests.models import write_tiny_gguf
from tests.waiting import wait_until

# one question, typed for each SDK it is sent with (Ollama's takes any mapping, as does a JSON body)
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
HI_ANTHROPIC: list[MessageParam] = [{"role": "user", "content": "hi"}]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("metrics")
    with tiny_daemon(home, llama_server) as running:
        # answers of many tokens: llama-server caps a slot's context at the model's trained one
        long = write_tiny_gguf(home / "long.gguf", seed=4, context_length=8192)
        running.cli("package", "--gguf", str(long), "tiny-long")
        yield running


def scrape(daemon: Daemon) -> Samples:
    response = daemon.http("GET", "/metrics")
    assert response.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def grew(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_every_api_is_counted_timed_and_its_tokens_added(daemon: Daemon) -> None:
    before = scrape(daemon)
    client = openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused", max_retries=0)
    whole = client.chat.completions.create(model="tiny", messages=HI, max_tokens=5)
    assert whole.usage is not None
    generated = {"openai": whole.usage.completion_tokens}
    prompts = {"openai": whole.usage.prompt_tokens}
    # streamed, asked for by another spelling of the same model: one label, the store's name
    stream = client.chat.completions.create(
        model="ai/tiny:latest",
        messages=HI,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None
    generated["openai"] += chunks[-1].usage.completion_tokens
    prompts["openai"] += chunks[-1].usage.prompt_tokens

    lines = list(
        ollama.Client(host=daemon.url).chat(
            model="tiny", messages=HI, stream=True, options={"num_predict": 4}
        )
    )
    generated["ollama"] = lines[-1].eval_count or 0
    prompts["ollama"] = lines[-1].prompt_eval_count or 0

    messages = anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)
    with messages.messages.stream(model="tiny", max_tokens=3, messages=HI_ANTHROPIC) as events:
        final = events.get_final_message()
    generated["anthropic"] = final.usage.output_tokens
    usage = final.usage
    prompts["anthropic"] = (
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    )

    # refused before any model was found (an unknown model: a name no label may carry; an empty chat)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model-xyz", messages=HI)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[])

    after = scrape(daemon)
    for api in ("openai", "ollama", "anthropic"):
        successes = 2 if api == "openai" else 1
        assert grew(
            before, after, "modelrunner_requests_total", api=api, model="tiny", status_class="2xx"
        ) == (successes), api
        assert grew(before, after, "modelrunner_request_duration_seconds_count", api=api, model="tiny") == (
            successes
        )
        assert grew(before, after, "modelrunner_time_to_first_byte_seconds_count", api=api, model="tiny") == (
            successes
        )
        assert grew(before, after, "modelrunner_request_duration_seconds_sum", api=api, model="tiny") > 0
        # tokens as the clients were told them
        assert (
            grew(before, after, "modelrunner_generated_tokens_total", api=api, model="tiny") == generated[api]
        )
        assert grew(before, after, "modelrunner_prompt_tokens_total", api=api, model="tiny") == prompts[api]
    # first tokens of streamed answers only: the whole OpenAI answer has none
    for api, streamed in (("openai", 1), ("ollama", 1), ("anthropic", 1)):
        assert (
            grew(before, after, "modelrunner_time_to_first_token_seconds_count", api=api, model="tiny")
            == streamed
        )
    assert grew(before, after, "modelrunner_requests_total", api="openai", model="", status_class="4xx") == 2
    text = daemon.http("GET", "/metrics").text
    assert "no-such-model-xyz" not in text and 'model="ai/tiny:latest"' not in text
    # the buckets of a histogram add up to its count
    count = value(after, "modelrunner_request_duration_seconds_count", api="openai", model="tiny")
    assert (
        value(after, "modelrunner_request_duration_seconds_bucket", api="openai", model="tiny", le="+Inf")
        == count
    )

    # the recorder shows the same counts and the access line's timing
    [entry] = [
        e for e in daemon.http("GET", "/engines/requests").json() if e["records"][0]["model"] == "tiny"
    ]
    record = entry["records"][0]
    assert record["completion_tokens"] == whole.usage.completion_tokens
    assert record["prompt_tokens"] == whole.usage.prompt_tokens
    assert record["duration_ms"] >= record["ttfb_ms"] > 0
    assert record["request_id"]


def test_gauges_follow_the_runners_and_the_requests_they_answer(daemon: Daemon) -> None:
    body = {
        "model": "tiny-long",
        "messages": HI,
        "max_tokens": 6000,
        "stream": True,
        "ignore_eos": True,
    }
    started = threading.Event()
    stop = threading.Event()

    def generate() -> None:
        with httpx.stream("POST", daemon.url + "/engines/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                # a token: the request holds its runner (a slow load sends keep-alive comments first)
                if line.startswith("data: "):
                    started.set()
                if stop.is_set():
                    return  # leaving closes the stream: the engine stops

    thread = threading.Thread(target=generate)
    thread.start()
    try:
        assert started.wait(120)
        during = scrape(daemon)
        assert value(during, "modelrunner_requests_running") == 1
        assert value(during, "modelrunner_queue_depth") == 0
        runners = daemon.http("GET", "/engines/ps").json()
        in_use = value(during, "modelrunner_memory_in_use_bytes")
        assert in_use > 0 and value(during, "modelrunner_memory_budget_bytes") >= in_use
        assert len(runners) == value(during, "modelrunner_loaded_runners")
    finally:
        stop.set()
        thread.join(60)
    wait_until(lambda: value(scrape(daemon), "modelrunner_requests_running") == 0, "the stream's end")
    assert daemon.http("POST", "/engines/unload", json={"all": True}).status_code == 200
    assert value(scrape(daemon), "modelrunner_memory_in_use_bytes") == 0
