"""Content digests: the one rule for what a digest is, `sha256:<64 lowercase hex>`.

Digests name blobs in manifests, references, model IDs and the store's paths, so this module sits below all
of them and imports nothing of the project's but errors.
"""

from __future__ import annotations

import re

from modelrunner.errors import InvalidDigest, quote_input

# As strings, matched through re's own cache: compiled when first used, not by every process that imports
# this module.
_DIGEST = r"sha256:[0-9a-f]{64}"
_ANY_CASE_HEX64 = r"[0-9a-fA-F]{64}"


def validate_digest(text: str) -> str:
    """Return `text` if it is exactly `sha256:<64 lowercase hex>`; raise InvalidDigest otherwise."""
    problem = digest_problem(text)
    if problem is not None:
        raise InvalidDigest(f"invalid digest {quote_input(text)}: {problem}")
    return text


def digest_problem(text: str) -> str | None:
    """What is wrong with `text` as a digest, in words for a message; None when it is one."""
    if re.fullmatch(_DIGEST, text):
        return None
    algorithm, colon, hex_part = text.partition(":")
    if not colon:
        return "expected sha256:<64 lowercase hex characters>"
    if algorithm != "sha256":
        return f"algorithm must be 'sha256', got {quote_input(algorithm)}"
    if len(hex_part) != 64:
        return f"expected 64 hex characters after 'sha256:', got {len(hex_part)}"
    if re.fullmatch(_ANY_CASE_HEX64, hex_part):
        return "hex characters must be lowercase"
    return "expected 64 lowercase hex characters (0-9, a-f) after 'sha256:'"
