"""Ollama's `truncate` for `/api/embed`: an input longer than the model takes loses its end.

Ollama (server/routes.go, EmbedHandler) embeds first; when the runner refuses an input as too long, it
tokenizes the input, keeps as many tokens as fit beside the special tokens the model adds, and embeds
that. Here the engine is llama-server: its refusal says its limit (served_call.InputTooLong); the inputs are
tokenized by its `/tokenize`, with and without the special tokens (BOS, EOS/SEP) it adds, so that the
kept tokens are sent as token arrays, special tokens in place, exactly what it would have embedded.
"""

from __future__ import annotations

from modelrunner.compat.context_overflow import OLLAMA_WORDS
from modelrunner.engines.base import Mode
from modelrunner.errors import BadRequest, ModelRunnerError
from modelrunner.server.engine_request import call_engine
from modelrunner.server.lifecycle import Inference

# Ollama's words (its runners and EmbedHandler), which clients match on.
EXCEEDS_CONTEXT = OLLAMA_WORDS
NOTHING_LEFT = "input after truncation exceeds maximum context length"


async def fitted(
    inference: Inference, name: str, inputs: list[str], limit: int, keep_alive: float | None
) -> list[list[int]]:
    """Each input as the tokens the engine embeds, those beyond `limit` cut from the end of its text."""
    out = []
    for text in inputs:
        tokens = await _tokens(inference, name, text, True, keep_alive)
        if len(tokens) > limit:
            tokens = cut(tokens, await _tokens(inference, name, text, False, keep_alive), limit)
        out.append(tokens)
    return out


def cut(with_special: list[int], plain: list[int], limit: int) -> list[int]:
    """`with_special` (= specials before + `plain` + specials after) with `plain` cut to fit `limit`."""
    specials = len(with_special) - len(plain)
    keep = limit - specials
    if keep <= 0:
        raise BadRequest(NOTHING_LEFT)
    start = next(
        (i for i in range(specials + 1) if with_special[i : i + len(plain)] == plain),
        specials,  # not found as a run: the specials were all prepended
    )
    return with_special[:start] + plain[:keep] + with_special[start + len(plain) :]


async def _tokens(
    inference: Inference, name: str, text: str, special: bool, keep_alive: float | None
) -> list[int]:
    body = {"content": text, "add_special": special, "parse_special": True}
    call = await call_engine(inference, name, "/tokenize", body, Mode.EMBEDDING, keep_alive)
    try:
        answer = await call.json()
    finally:
        await call.close()
    tokens = answer.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise ModelRunnerError("the engine sent an unexpected answer to /tokenize")
    return tokens
