"""Drafting from the context: llama-server's draftless n-gram speculative decoding (b11434 `--spec-type`
`ngram-mod`, `ngram-simple`, `ngram-map-k`), which proposes the tokens that followed the last few tokens
where they appeared before in the conversation, for the model to verify in one batch. An answer that
copies its context (an agent's file edit, tool arguments that repeat code) is generated several tokens a
step; other answers draft nothing and cost what they did.

Chosen per model (`model configure --draft-from-context TYPE MODEL`: the `llamacpp` object's
`draft-from-context`), off by default: on this project's CPU a drafted greedy answer is not always the
undrafted one byte for byte. The verifying batch computes logits with other kernels than one-token decoding,
and where the two best tokens nearly tie (measured: log-probabilities 0.015 to 0.28 apart) the batch can
choose the other (bench/edit_drafting.py; RESULTS "Edit turns drafted from the context").

`true` chooses ngram-mod: it was the one type that never cost (an answer with nothing to copy drafts
nothing) and gained 1.9-4.2x on edit turns; ngram-simple and ngram-map-k gained up to 3x copying a file
but drafted a third right on another answer, 0.8x. ngram-mod keeps its n-grams across requests, so a
repeated greedy request can be answered otherwise after other requests.

Its counts (tokens drafted, accepted) are the runner's own Prometheus counters: `/metrics` relays them
labelled by model, `model ps` and the dashboard show the share accepted (`draft_counts`).
"""

from __future__ import annotations

from pathlib import Path

from modelrunner import http1
from modelrunner.engines.base import DraftCounts

SPEC_TYPE_FLAG = "--spec-type"
CONTEXT_TYPES = ("ngram-mod", "ngram-simple", "ngram-map-k")
DEFAULT_TYPE = "ngram-mod"  # what `true` chooses (above)
DRAFT_MODEL_TYPE = "draft-simple"  # b11434 loads a draft model but drafts with it only when told

_DRAFTED = b"llamacpp:spec_decode_num_draft_tokens_total "
_ACCEPTED = b"llamacpp:spec_decode_num_accepted_tokens_total "
_METRICS_BYTES = 64 * 1024  # llama-server's /metrics is ~3 KB


def spec_types(context_type: str | None, draft_model: bool) -> list[str]:
    """The `--spec-type` list: drafts from the context first (they cost nothing to make), then the draft
    model's; llama-server asks each in this order until one proposes a draft."""
    return [*([context_type] if context_type else []), *([DRAFT_MODEL_TYPE] if draft_model else [])]


def drafting(argv: list[str]) -> str:
    """How a runner drafts, as `model ps` shows it: its `--spec-type` list (the last one given, as
    llama-server reads it), "" when it does not draft."""
    given = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == SPEC_TYPE_FLAG]
    return given[-1] if given and given[-1] != "none" else ""


async def draft_counts(socket: Path, timeout: float) -> DraftCounts | None:
    """Tokens drafted and accepted so far, from the runner's /metrics; None when it does not answer."""
    answer = await http1.request(str(socket), "GET", "/metrics", timeout=timeout, max_body=_METRICS_BYTES)
    if answer is None or answer[0] != 200:
        return None
    drafted = accepted = None
    for line in answer[1].splitlines():
        if line.startswith(_DRAFTED):
            drafted = _count(line[len(_DRAFTED) :])
        elif line.startswith(_ACCEPTED):
            accepted = _count(line[len(_ACCEPTED) :])
    if drafted is None or accepted is None:
        return None
    return DraftCounts(drafted=drafted, accepted=min(accepted, drafted))


def _count(value: bytes) -> int | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return int(number) if 0 <= number < 2**53 else None
