"""`model verify --local`: a model in the store checked offline, against the signature its verified pull
kept (signing/record.py), by the same rules as a registry's (signing/registry.py verify_signatures).
`deep` hashes every blob file again and compares it with its digest, then records the files as they are
(a ctime moved by a hard link no longer stops a load); without it, the blob files must be as they were when
verified (the check before a load).
"""

from __future__ import annotations

from typing import Any

from modelrunner.errors import InvalidReference
from modelrunner.reference import Reference, parse_reference
from modelrunner.signing import keys
from modelrunner.signing.payload import InvalidSignature
from modelrunner.signing.record import (
    blob_hash_problem,
    problem_before_load,
    read_record,
    record_blobs_as_they_are,
)
from modelrunner.signing.registry import verify_signatures
from modelrunner.store.store import ModelStore, StoredModel


def _reference(name: str, model: StoredModel, signed_for: str) -> Reference:
    """The name the signature must be for: the one asked about, or for a model named by its ID, the one
    it was signed for."""
    short = name.removeprefix("sha256:")
    if all(c in "0123456789abcdef" for c in short) and model.id.removeprefix("sha256:").startswith(short):
        try:
            return parse_reference(signed_for)
        except InvalidReference:
            raise InvalidSignature("the kept signature names no valid reference") from None
    return parse_reference(name)


def verify_stored(store: ModelStore, name: str, public_pems: list[str], deep: bool) -> dict[str, Any]:
    """The stored model `name` against the keys: its kept signature, then its blob files; InvalidSignature
    with the reason otherwise. What was checked, for the CLI to print."""
    public_keys = [keys.load_public_key(pem.encode()) for pem in public_pems]
    if not public_keys:
        raise InvalidSignature("no public key to verify with")
    model = store.get(name, by_name=True)
    record = read_record(store, model.id)
    kept = record.kept_signature() if record is not None and record.digest == model.id else None
    if record is None or kept is None:
        raise InvalidSignature(
            f"{name} has no signature kept in the store (it was not pulled under a trust policy that "
            "verified it); verify it in its registry without --local"
        )
    reference = _reference(name, model, record.docker_reference)
    verified = verify_signatures([kept], reference, model.id, public_keys)
    if deep:
        hashed = blob_hash_problem(store, model)
        if hashed is not None:
            raise InvalidSignature(hashed)
        record_blobs_as_they_are(store, model, record)  # what the check before a load compares with
    else:
        problem = problem_before_load(store, model)
        if problem is not None:
            raise InvalidSignature(f"{name}: {problem}")
    return {
        "id": model.id,
        "signer": verified.signer,
        "dockerReference": verified.docker_reference,
        "deep": deep,
        "verification": record.to_api(),
    }
