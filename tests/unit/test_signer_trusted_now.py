"""signing/record.signer_problem: who signed a stored model, checked against the rule in force now: a key's
kept signature must verify with one of the rule's keys and name this manifest; a keyless signer must be one
of the rule's identities; a record of a key signature that keeps none cannot say, and is refused."""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives.asymmetric import ec

from modelrunner.signing import keys
from modelrunner.signing.payload import make_payload
from modelrunner.signing.policy import Rule
from modelrunner.signing.record import Record, signer_problem
from tests.signing_fixtures import key

DIGEST = "sha256:" + "a" * 64
REFERENCE = "registry.example/team/m:v1"


def pem(private: ec.EllipticCurvePrivateKey) -> str:
    return keys.public_pem(private.public_key()).decode()


def key_record(private: ec.EllipticCurvePrivateKey, digest: str = DIGEST) -> Record:
    payload = make_payload(REFERENCE, digest)
    signature = keys.sign(private, payload)
    signer = keys.key_id(private.public_key())
    encoded = base64.b64encode(payload).decode(), base64.b64encode(signature).decode()
    return Record(DIGEST, signer, REFERENCE, 0.0, {}, *encoded)


def test_a_key_signature_holds_only_while_its_key_is_trusted() -> None:
    old, new = key(), key()
    record = key_record(old)
    assert signer_problem(record, DIGEST, Rule("registry.example/team/*", (pem(old),), "enforce")) is None
    assert signer_problem(record, DIGEST, Rule("*", (pem(new), pem(old)), "enforce")) is None
    rotated = signer_problem(record, DIGEST, Rule("registry.example/team/*", (pem(new),), "enforce"))
    assert rotated is not None
    assert f"signed by key {record.signer[:19]}" in rotated and "no longer trusts" in rotated


def test_a_signature_kept_for_another_manifest_does_not_hold() -> None:
    private = key()
    record = key_record(private, "sha256:" + "b" * 64)  # the record says DIGEST; what was signed is not
    problem = signer_problem(record, DIGEST, Rule("*", (pem(private),), "enforce"))
    assert problem is not None and "for another manifest" in problem


def test_a_keyless_signer_holds_only_while_its_identity_is_trusted() -> None:
    record = Record(DIGEST, "dev@example.com (https://issuer.example)", REFERENCE, 0.0, {})
    trusted = Rule("*", (), "enforce", (("dev@example.com", "https://issuer.example"),))
    assert signer_problem(record, DIGEST, trusted) is None
    other = Rule("*", (), "enforce", (("ops@example.com", "https://issuer.example"),))
    problem = signer_problem(record, DIGEST, other)
    assert problem is not None and "dev@example.com" in problem and "no longer trusts" in problem


def test_a_key_record_that_keeps_no_signature_is_verified_again() -> None:
    private = key()
    record = Record(DIGEST, keys.key_id(private.public_key()), REFERENCE, 0.0, {})  # the first records' form
    problem = signer_problem(record, DIGEST, Rule("*", (pem(private),), "enforce"))
    assert problem is not None and "keeps no signature" in problem
