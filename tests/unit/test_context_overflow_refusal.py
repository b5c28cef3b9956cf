"""An engine's refusal of a prompt over the context, in the words each API's clients act on."""

from __future__ import annotations

import json

import pytest

from modelrunner.compat.context_overflow import ContextOverflow, refusal
from modelrunner.errors import BadRequest
from modelrunner.server.errors import exception_payload
from modelrunner.server.routes import ANTHROPIC, OLLAMA, OPENAI, RESPONSES

LLAMA = {
    "error": {
        "code": 400,
        "message": "request (2031 tokens) exceeds the available context size (512 tokens), try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 2031,
        "n_ctx": 512,
    }
}
VLLM = {
    "error": {
        "message": "This model's maximum context length is 512 tokens. However, your prompt contains "
        "at least 2031 input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the "
        "length of the input prompt.",
        "type": "BadRequestError",
        "param": "input_tokens",
        "code": 400,
    }
}


@pytest.mark.parametrize(
    "body",
    [
        LLAMA,
        {"error": {**LLAMA["error"], "type": "invalid_request_error"}},  # its words without its fields
        VLLM,
    ],
)
def test_engine_refusals_are_read(body: dict[str, object]) -> None:
    overflow = refusal(400, json.dumps(body).encode())
    assert overflow is not None and (overflow.tokens, overflow.limit) == (2031, 512)


def test_vllms_refusal_in_characters_is_the_fewest_tokens_they_can_be() -> None:
    """vLLM refuses a text over the context times its longest token (13 characters here) before tokenizing
    it; the count agents compact by is then the fewest tokens the text can be, already over the limit."""
    message = (
        "This model's maximum context length is 4096 tokens. However, your prompt contains 60013 characters "
        "(more than 53248 characters, which is the upper bound for 4096 input tokens). Please reduce the "
        "length of the input prompt."
    )
    body = {"error": {**VLLM["error"], "message": message, "param": "input_text"}}
    overflow = refusal(400, json.dumps(body).encode())
    assert overflow is not None and (overflow.tokens, overflow.limit) == (4617, 4096)  # 60013 / 13, up
    assert overflow.anthropic_message == "prompt is too long: 4617 tokens > 4096 maximum"


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, json.dumps(LLAMA).encode()),
        (
            400,
            b'{"error": {"message": "messages: must be a non-empty list", "type": "invalid_request_error"}}',
        ),
        (400, b"not json"),
        (400, b'["error"]'),
    ],
)
def test_other_answers_are_not_overflows(status: int, body: bytes) -> None:
    assert refusal(status, body) is None


def test_each_api_gets_its_words() -> None:
    overflow = ContextOverflow(2031, 512)
    anthropic = exception_payload(ANTHROPIC, overflow)
    assert anthropic == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 2031 tokens > 512 maximum",
        },
    }
    for family in (OPENAI, RESPONSES):
        error = exception_payload(family, overflow)["error"]
        assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
        assert error["message"].startswith(
            "This model's maximum context length is 512 tokens. "
            "However, your messages resulted in 2031 tokens."
        )
    ollama = exception_payload(OLLAMA, overflow)["error"]
    assert ollama.startswith("the input length exceeds the context length")


def test_our_own_words_read_back_the_same() -> None:
    """A reworded refusal read again (ServedCall.json reads what `answer` wrote) keeps its numbers."""
    body = json.dumps(exception_payload(OPENAI, ContextOverflow(700, 512))).encode()
    again = refusal(400, body)
    assert again is not None and (again.tokens, again.limit) == (700, 512)


def test_other_refusals_keep_their_shape() -> None:
    error = exception_payload(OPENAI, BadRequest("no", param="model"))["error"]
    assert error == {"message": "no", "type": "invalid_request_error", "code": 400, "param": "model"}
