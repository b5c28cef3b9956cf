"""A request needing what its model cannot do is a 400 in each API's own shape, through the official clients
(no retries: a 400 is final), and no engine is started for it: an image for a model without a multimodal
projector, tools for the shipped gemma3.jinja (which cannot render them). Real daemon, llama-server, tiny
GGUF."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anthropic
import ollama
import openai
import pytest
from openai.types.responses import FunctionToolParam
from openai.types.shared_params import FunctionDefinition

from tests.daemon import Daemon
from tests.engines import tiny_daemon

GEMMA_TEMPLATE = Path(__file__).resolve().parents[2] / "src" / "modelrunner" / "templates" / "gemma3.jinja"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
FUNCTION: FunctionDefinition = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    """`tiny`: the tiny GGUF, whose template renders tools; `plain`: the same with the shipped gemma3.jinja.
    Neither has a projector."""
    home = tmp_path_factory.mktemp("capabilities")
    with tiny_daemon(home, llama_server) as running:
        gguf = str(home / "tiny.gguf")  # tiny_daemon's
        running.cli("package", "--gguf", gguf, "--chat-template", str(GEMMA_TEMPLATE), "plain")
        yield running


def openai_client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/engines/v1", api_key="unused", max_retries=0)


def anthropic_client(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0)


def no_runner_of(daemon: Daemon, model: str) -> bool:
    return all(r["model_name"] != model for r in daemon.http("GET", "/engines/ps").json())


def refused_everywhere(daemon: Daemon, model: str, images: bool, tools: bool) -> list[str]:
    """The error message each API answered (each call must fail with its SDK's 400 error)."""
    chat_content: Any = "what is this?"
    blocks: Any = "what is this?"
    items: Any = "what is this?"
    if images:
        chat_content = [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]
        blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]
        items = [
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}],
            }
        ]
    chat_tools: Any = [{"type": "function", "function": FUNCTION}] if tools else openai.NOT_GIVEN
    messages: list[str] = []

    with pytest.raises(openai.BadRequestError) as chat:
        openai_client(daemon).chat.completions.create(
            model=model, messages=[{"role": "user", "content": chat_content}], tools=chat_tools, max_tokens=2
        )
    messages.append(chat.value.body["message"])  # type: ignore[index]

    with pytest.raises(openai.BadRequestError) as responses:
        openai_client(daemon).responses.create(
            model=model,
            input=items,
            # the SDK's FunctionToolParam requires `strict` (and `parameters`): the tool is sent without it
            tools=[cast(FunctionToolParam, {"type": "function", **FUNCTION})] if tools else openai.omit,
            max_output_tokens=2,
        )
    messages.append(responses.value.body["message"])  # type: ignore[index]

    with pytest.raises(anthropic.BadRequestError) as messages_api:
        anthropic_client(daemon).messages.create(
            model=model,
            max_tokens=2,
            messages=[{"role": "user", "content": blocks}],
            tools=[{"name": FUNCTION["name"], "input_schema": FUNCTION["parameters"]}]
            if tools
            else anthropic.omit,
        )
    assert messages_api.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    messages.append(messages_api.value.body["error"]["message"])  # type: ignore[index]

    with pytest.raises(ollama.ResponseError) as ollama_chat:
        ollama.Client(host=daemon.url).chat(
            model=model,
            messages=[{"role": "user", "content": "what is this?", "images": [PNG] if images else None}],
            tools=[{"type": "function", "function": FUNCTION}] if tools else None,
            options={"num_predict": 2},
        )
    assert ollama_chat.value.status_code == 400
    messages.append(ollama_chat.value.error)
    return messages


@pytest.mark.parametrize("model", ["plain", "tiny"])
def test_an_image_without_a_projector_is_a_400_on_every_api(daemon: Daemon, model: str) -> None:
    for message in refused_everywhere(daemon, model, images=True, tools=False):
        assert message.startswith(f"{model} does not support vision")
    assert no_runner_of(daemon, model)  # refused before any engine was asked


def test_tools_for_a_template_that_cannot_render_them_are_a_400_on_every_api(daemon: Daemon) -> None:
    for message in refused_everywhere(daemon, "plain", images=False, tools=True):
        assert message.startswith("plain does not support tools")
    assert no_runner_of(daemon, "plain")


def test_tools_reach_a_template_that_renders_them(daemon: Daemon) -> None:
    answer = openai_client(daemon).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[{"type": "function", "function": FUNCTION}],
        max_tokens=2,
    )
    assert answer.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_a_refused_request_is_in_the_recorded_requests_with_its_reason(daemon: Daemon) -> None:
    """An agent that fails on a 400 before any engine leaves its request in `model requests` (issue 34): the
    user sees what was sent and why it was refused."""
    with pytest.raises(openai.BadRequestError):
        openai_client(daemon).chat.completions.create(
            model="plain",
            messages=[{"role": "user", "content": "refuse me"}],
            tools=[{"type": "function", "function": FUNCTION}],
        )
    shown = daemon.cli("requests", "--model", "plain")
    assert shown.returncode == 0, shown.stderr
    [entry] = json.loads(shown.stdout)
    [record] = [r for r in entry["records"] if "refuse me" in r["request"]]
    assert record["status_code"] == 400 and "plain does not support tools" in record["error"]
    assert no_runner_of(daemon, "plain")
