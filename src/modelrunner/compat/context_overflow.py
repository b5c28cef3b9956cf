"""A prompt longer than the model's context, refused in the words each API's clients act on.

Engines refuse such a prompt before they evaluate any of it (llama-server when it gives the task a slot,
vLLM when it renders the input), so their refusal is translated rather than the prompt counted first
(a tokenization round trip on every request): llama-server's `exceed_context_size_error` carries
`n_prompt_tokens` and `n_ctx`, vLLM says both in its message. Agents compact their conversation on these
words: Anthropic's "prompt is too long: N tokens > M maximum", OpenAI's `context_length_exceeded`;
Ollama's clients get Ollama's own words.
"""

from __future__ import annotations

import json
import re

from modelrunner.errors import BadRequest

OPENAI_CODE = "context_length_exceeded"
OLLAMA_WORDS = "the input length exceeds the context length"  # Ollama's (its runners), which clients match
LLAMA_TYPE = "exceed_context_size_error"
_LLAMA = re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)")
# vLLM's words (vllm/renderers/params.py) and OpenAI's, which this module writes itself
_OPENAI_WORDS = re.compile(
    r"maximum context length is (\d+) tokens\. However, (?:your prompt contains (?:at least )?"
    r"|your request has |your messages resulted in )(\d+) (?:input )?tokens"
)

# vLLM refuses a text longer than the context times its longest token before it tokenizes it, in characters;
# no token can be longer, so the prompt has at least characters / (bound / limit) tokens
_VLLM_CHARACTERS = re.compile(
    r"maximum context length is (\d+) tokens\. However, your prompt contains (\d+) characters \(more than "
    r"(\d+) characters, which is the upper bound for (\d+) input tokens\)"
)


class ContextOverflow(BadRequest):
    """The prompt (`tokens`) does not fit the model's context (`limit`); `message` is OpenAI's words."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(
            f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
            f"{tokens} tokens. Please reduce the length of the messages."
        )
        self.tokens = tokens
        self.limit = limit

    @property
    def anthropic_message(self) -> str:
        return f"prompt is too long: {self.tokens} tokens > {self.limit} maximum"

    @property
    def ollama_message(self) -> str:
        return f"{OLLAMA_WORDS} ({self.tokens} tokens > {self.limit})"


def refusal(status: int, body: bytes) -> ContextOverflow | None:
    """The overflow an engine's error answer reports, or None for any other answer."""
    if status != 400:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict):
        return None
    tokens, limit = error.get("n_prompt_tokens"), error.get("n_ctx")
    if error.get("type") == LLAMA_TYPE and isinstance(tokens, int) and isinstance(limit, int):
        return ContextOverflow(tokens, limit)
    message = error.get("message")
    if not isinstance(message, str):
        return None
    match = _LLAMA.search(message)
    if match is not None:
        return ContextOverflow(int(match.group(1)), int(match.group(2)))
    match = _OPENAI_WORDS.search(message)
    if match is not None:
        return ContextOverflow(int(match.group(2)), int(match.group(1)))
    match = _VLLM_CHARACTERS.search(message)
    if match is not None:
        limit, characters, bound, tokens = (int(group) for group in match.groups())
        return ContextOverflow(-(-characters * tokens // bound), limit)  # rounded up
    return None
