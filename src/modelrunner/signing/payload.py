"""cosign's simple-signing payload: what a signature signs, the manifest digest and the reference."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from modelrunner.digest import validate_digest
from modelrunner.errors import InvalidDigest
from modelrunner.signing.keys import InvalidKey

PAYLOAD_TYPE = "cosign container image signature"
MAX_PAYLOAD_BYTES = 64 * 1024


class InvalidSignature(InvalidKey):
    """A signature, or what carries it, that does not hold: wrong digest, bad bytes, malformed manifest."""


@dataclass(frozen=True)
class SignedClaim:
    docker_reference: str
    manifest_digest: str


def make_payload(docker_reference: str, manifest_digest: str) -> bytes:
    """The payload as cosign and containers/image write it (`optional` null, compact JSON)."""
    document = {
        "critical": {
            "identity": {"docker-reference": docker_reference},
            "image": {"docker-manifest-digest": manifest_digest},
            "type": PAYLOAD_TYPE,
        },
        "optional": None,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def _get(document: Any, *path: str) -> Any:
    value = document
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    return value


def parse_payload(data: bytes) -> SignedClaim:
    """The claim of a payload whose signature was checked already; InvalidSignature if it is not one."""
    if len(data) > MAX_PAYLOAD_BYTES:
        raise InvalidSignature("the signature payload is too large")
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidSignature("the signature payload is not JSON") from None
    if _get(document, "critical", "type") != PAYLOAD_TYPE:
        raise InvalidSignature("the signature payload is not a cosign container image signature")
    reference = _get(document, "critical", "identity", "docker-reference")
    digest = _get(document, "critical", "image", "docker-manifest-digest")
    if not isinstance(reference, str) or not isinstance(digest, str):
        raise InvalidSignature("the signature payload names no reference or no digest")
    try:
        validate_digest(digest)
    except InvalidDigest:
        raise InvalidSignature("the signature payload's digest is not sha256:<64 hex>") from None
    return SignedClaim(reference, digest)
