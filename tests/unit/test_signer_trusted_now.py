"""signing/record.signer_problem: who signed a stored model, checked against the rule in force now: a key's
kept signature must verify with one of the rule's keys and name this manifest; a keyless signer must be one
of the rule's identities, its kept Sigstore bundle holding for this manifest (tests/fake_sigstore.py); a
record that keeps no signature or bundle cannot say, and is refused."""

from __future__ import annotations

import base64
import json

from cryptography.hazmat.primitives.asymmetric import ec

from modelrunner.signing import keys
from modelrunner.signing.payload import make_payload
from modelrunner.signing.policy import Rule
from modelrunner.signing.record import Record, signer_problem
from tests.fake_sigstore import FakeSigstore, statement
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


DEV = ("dev@example.com", "https://issuer.example")


def keyless_record(sigstore: FakeSigstore, signed: str = DIGEST) -> Record:
    bundle = json.dumps(sigstore.bundle(statement(REFERENCE, signed), *DEV)).encode()
    encoded = base64.b64encode(bundle).decode()
    return Record(DIGEST, f"{DEV[0]} ({DEV[1]})", REFERENCE, 0.0, {}, bundle=encoded)


def test_a_keyless_signer_holds_only_while_its_identity_is_trusted() -> None:
    sigstore = FakeSigstore()
    root = json.dumps(sigstore.trusted_root())
    record = keyless_record(sigstore)
    assert signer_problem(record, DIGEST, Rule("*", (), "enforce", (DEV,), root)) is None
    other = Rule("*", (), "enforce", (("ops@example.com", DEV[1]),), root)
    problem = signer_problem(record, DIGEST, other)
    assert problem is not None and "dev@example.com" in problem and "no longer trusts" in problem


def test_a_keyless_record_holds_only_for_the_manifest_its_bundle_names() -> None:
    """Issue 36 item 2: the signer's name is in the record for anyone who can write it; the bundle is not."""
    sigstore = FakeSigstore()
    trusted = Rule("*", (), "enforce", (DEV,), json.dumps(sigstore.trusted_root()))
    problem = signer_problem(keyless_record(sigstore, "sha256:" + "b" * 64), DIGEST, trusted)
    assert problem is not None and f"another manifest, not {DIGEST}" in problem
    elsewhere = Rule("*", (), "enforce", (DEV,), json.dumps(FakeSigstore().trusted_root()))
    problem = signer_problem(keyless_record(sigstore), DIGEST, elsewhere)  # another Sigstore's root
    assert problem is not None and "Sigstore bundle does not hold" in problem
    unkept = Record(DIGEST, f"{DEV[0]} ({DEV[1]})", REFERENCE, 0.0, {})  # the records before issue 36
    problem = signer_problem(unkept, DIGEST, trusted)
    assert problem is not None and "keeps no Sigstore bundle" in problem


def test_a_key_record_that_keeps_no_signature_is_verified_again() -> None:
    private = key()
    record = Record(DIGEST, keys.key_id(private.public_key()), REFERENCE, 0.0, {})  # the first records' form
    problem = signer_problem(record, DIGEST, Rule("*", (pem(private),), "enforce"))
    assert problem is not None and "keeps no signature" in problem
