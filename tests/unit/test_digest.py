"""The digest rule: `sha256:<64 lowercase hex>` and nothing else, with a message that says what is wrong."""

from __future__ import annotations

import pytest

from modelrunner.digest import validate_digest
from modelrunner.errors import InvalidDigest

HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"


def test_validate_digest() -> None:
    assert validate_digest(DIGEST) == DIGEST


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (f"sha256:{HEX.upper()}", "lowercase"),
        ("sha256:abc", "64 hex"),
        ("sha512:" + "a" * 128, "algorithm"),
        (HEX, "sha256:"),
        (f" {DIGEST}", "algorithm"),
        ("sha256:" + "z" * 64, "lowercase hex"),
        ("sha256:" + "a" * 10_000, "64 hex"),
    ],
)
def test_validate_digest_rejects(text: str, fragment: str) -> None:
    with pytest.raises(InvalidDigest, match=fragment) as caught:
        validate_digest(text)
    assert len(str(caught.value)) < 300
