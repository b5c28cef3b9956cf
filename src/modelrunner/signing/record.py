"""What the store keeps of a verification, and the check before a load.

A pull that verified a signature records, next to the store's index (`signatures/<hex>.json`), the signed
manifest digest, the signer, when, the signed payload and its signature (a keyless signer: its Sigstore
bundle), and each blob file's size, inode, modification time and status-change time (ctime). Before a model
is loaded under a rule that is not `off`, the record must hold under the policy in force then:

* who signed must be trusted now: the kept signature verifies with one of the rule's keys and names this
  model's manifest digest (a keyless one: the kept bundle verifies offline, against the rule's identities
  and trusted root, for this digest). A record made for a signer the policy no longer trusts, or copied
  from another model with its digest changed, does not count.
* each blob file is the one verified, unchanged since: same size, inode, mtime and ctime. No user can set
  a ctime back, so bytes written in place are seen even with the mtime restored. This proves the files
  were not touched, not what they hold: `model verify --deep` hashes them again (and, when they hash to
  their digests, records them as they are now). A new hard link to a blob changes its ctime as well (the
  bundle of another model sharing it): such a model is refused until `verify --deep` or a pull checks it.

The kept signature also lets `model verify --local` check it again offline against a key (signing/local.py).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner import config
from modelrunner.errors import BadRequest, InvalidArtifact, InvalidReference, ModelRunnerError
from modelrunner.fileio import hash_file
from modelrunner.reference import parse_reference
from modelrunner.signing import keyless, keys
from modelrunner.signing.payload import InvalidSignature, parse_payload
from modelrunner.signing.policy import InvalidPolicy, Rule, UntrustedModel, load_rules, policy_path, rule_for
from modelrunner.signing.registry import Signature, Verified
from modelrunner.store.store import ModelStore, StoredModel

log = logging.getLogger(__name__)

RECORDS_DIR = "signatures"


@dataclass(frozen=True)
class Record:
    digest: str
    signer: str
    docker_reference: str
    verified_at: float
    blobs: dict[str, list[int]]  # digest -> [size, inode, mtime_ns, ctime_ns] (no ctime in older records)
    payload: str = ""  # base64 of the signed simple-signing payload ("" in records of the first round)
    signature: str = ""  # base64 of its ECDSA signature
    bundle: str = ""  # a keyless signature's: base64 of its Sigstore bundle ("" in records before issue 36)

    def kept_signature(self) -> Signature | None:
        if not self.payload or not self.signature:
            return None
        try:
            return Signature(base64.b64decode(self.payload), base64.b64decode(self.signature))
        except ValueError:
            return None

    def to_api(self) -> dict[str, Any]:
        """What `inspect`, `ls --json` and the dashboard show: who signed, for what, and when checked."""
        verified_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.verified_at))
        return {"signer": self.signer, "dockerReference": self.docker_reference, "verifiedAt": verified_at}


def _record_name(model_id: str) -> str:
    return model_id.removeprefix("sha256:") + ".json"


def _record_path(store: ModelStore, model_id: str) -> Path:
    store.layout.blob_path(model_id)  # the one check that a digest is safe as a file name
    return store.layout.root / RECORDS_DIR / _record_name(model_id)


def _stat(path: Path) -> list[int]:
    info = os.stat(path)
    return [info.st_size, info.st_ino, info.st_mtime_ns, info.st_ctime_ns]


def _blob_stats(store: ModelStore, model: StoredModel) -> dict[str, list[int]]:
    return {b.digest: _stat(store.layout.blob_path(b.digest)) for b in model.manifest.blobs}


def blob_hash_problem(store: ModelStore, model: StoredModel, digests: set[str] | None = None) -> str | None:
    """Why a blob file of the model (of `digests` only, when given) does not hash to its digest; None when
    every one does. Reads them all: seconds per GB."""
    for blob in model.manifest.blobs:
        if digests is not None and blob.digest not in digests:
            continue
        try:
            digest, size = hash_file(store.layout.blob_path(blob.digest), "blob")
        except (OSError, BadRequest):
            return f"blob {blob.digest[:19]} is missing from the store"
        if digest != blob.digest or size != blob.size:
            return f"blob {blob.digest[:19]} does not hash to its digest any more"
    return None


def record_verification(
    store: ModelStore, model: StoredModel, verified: Verified, pull_started_ns: int | None = None
) -> None:
    """Keep what was verified. With `pull_started_ns`, the blob files already in the store before the pull
    (ctime older) and not as a record of this model says are hashed first, so that a pull never records
    as verified a file changed in the store (InvalidArtifact then); the pull wrote and hashed the others."""
    if pull_started_ns is not None:
        before = read_record(store, model.id)
        recorded = before.blobs if before is not None and before.digest == model.id else {}
        found = _blob_stats(store, model)
        older = {d for d, now in found.items() if now[3] < pull_started_ns and recorded.get(d) != now}
        problem = blob_hash_problem(store, model, older)
        if problem is not None:
            raise InvalidArtifact(f"{problem}: remove the model and pull it again")
    store.bundle_of(model)  # its hard links change the blobs' ctime: made before the ctime is recorded
    blobs = _blob_stats(store, model)
    kept = verified.signature
    record = Record(
        verified.digest,
        verified.signer,
        verified.docker_reference,
        time.time(),
        blobs,
        base64.b64encode(kept.payload).decode() if kept else "",
        base64.b64encode(kept.signature).decode() if kept else "",
        base64.b64encode(verified.bundle).decode() if verified.bundle else "",
    )
    _write_record(store, model.id, record)


def _write_record(store: ModelStore, model_id: str, record: Record) -> None:
    from modelrunner.fileio import write_file_atomic

    path = _record_path(store, model_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomic(path, json.dumps(record.__dict__).encode())


def record_blobs_as_they_are(store: ModelStore, model: StoredModel, record: Record) -> None:
    """After `verify --deep` proved every blob file's content: the record takes their stats as they are
    now (a ctime moved by a hard link, or a record older than ctime); rewritten only where they differ."""
    blobs = _blob_stats(store, model)
    if blobs != record.blobs:
        _write_record(store, model.id, dataclasses.replace(record, blobs=blobs))


def read_record(store: ModelStore, model_id: str) -> Record | None:
    try:
        document: Any = json.loads(_record_path(store, model_id).read_bytes())
        return Record(**document)
    except (OSError, ValueError, TypeError):
        return None


def listed_with_verification(store: ModelStore, models: list[StoredModel]) -> list[dict[str, Any]]:
    """`with_verification` of every model of a listing, reading a record only where its file is there: one
    listing of the folder instead of a failed open per unsigned model (1,000 models: bench/growth.py), and
    the policy read once."""
    try:
        recorded = set(os.listdir(store.layout.root / RECORDS_DIR))
    except OSError:
        recorded = set()
    rules = _rules_for_listing() if recorded else []
    return [
        with_verification(store, model.to_api(), rules)
        if _record_name(model.id) in recorded
        else model.to_api()
        for model in models
    ]


def _rules_for_listing() -> list[Rule]:
    """The policy, for a listing to say which signers it no longer trusts; a policy that does not hold
    fails loads and pulls with the reason, not the listing ([] here, logged)."""
    try:
        return load_rules(policy_path(config.runner_home()))
    except InvalidPolicy as exc:
        log.warning("listing without the trust policy: %s", exc.message)
        return []


def with_verification(
    store: ModelStore, model: dict[str, Any], rules: list[Rule] | None = None
) -> dict[str, Any]:
    """DMR's model object, plus `verification` where the store holds one (absent otherwise, so that an
    unsigned model's object is DMR's byte for byte). `notTrusted` in it says why the policy (read here
    unless `rules` are given) no longer trusts who signed."""
    record = read_record(store, str(model["id"]))
    if record is None or record.digest != model["id"]:
        return model
    verification = record.to_api()
    tags = [str(tag) for tag in model.get("tags", [])]
    rule = _strictest(tags, _rules_for_listing() if rules is None else rules)
    if rule is not None and rule.mode != "off":
        problem = signer_problem(record, record.digest, rule)
        if problem is not None:
            verification["notTrusted"] = problem
    return {**model, "verification": verification}


def _strictest(tags: list[str], rules: list[Rule]) -> Rule | None:
    """The strictest rule that matches one of the tags."""
    order = {"enforce": 0, "warn": 1, "off": 2}
    matched = []
    for tag in tags:
        try:
            rule = rule_for(rules, parse_reference(tag))
        except InvalidReference:
            continue
        if rule is not None:
            matched.append(rule)
    return min(matched, key=lambda r: order[r.mode], default=None)


def signer_problem(record: Record, model_id: str, rule: Rule) -> str | None:
    """Why `rule` does not trust the verification `record` keeps for the model `model_id`; None when it
    does: a key's kept signature must verify with one of the rule's keys now and name this manifest
    digest; a keyless signer must be one of the rule's identities, and the kept bundle hold for this
    manifest digest under them and the rule's trusted root."""
    again = "sign it again with a trusted key, then pull it again to verify it anew"
    kept = record.kept_signature()
    if kept is None:
        if record.signer in {f"{identity} ({issuer})" for identity, issuer in rule.identities}:
            if not record.bundle:
                return "its verification record (an older one) keeps no Sigstore bundle: pull it again"
            return _kept_bundle_problem(
                record.bundle, record.docker_reference, model_id, rule.identities, rule.trusted_root
            )
        if record.signer.startswith("sha256:"):
            return "its verification record (an older one) keeps no signature: pull it again to verify it"
        return f"it was signed by {record.signer[:200]}, whom the trust policy no longer trusts: {again}"
    key = next((k for k in rule.public_keys() if keys.signature_valid(k, kept.signature, kept.payload)), None)
    if key is None:
        return f"it was signed by key {record.signer[:19]}, which the trust policy no longer trusts: {again}"
    try:
        claim = parse_payload(kept.payload)
    except InvalidSignature as exc:
        return f"its kept signature does not hold: {exc.message}"
    if claim.manifest_digest != model_id:
        return f"its kept signature is for another manifest ({claim.manifest_digest[:19]}), not this model"
    return None


def _kept_bundle_problem(
    bundle: str, name: str, digest: str, identities: tuple[tuple[str, str], ...], trusted_root: str | None
) -> str | None:
    """Why the Sigstore bundle a keyless pull kept does not hold for `digest` under `identities` and the
    trusted root (offline: Sigstore's own from its local copy); None when it does."""
    try:
        _kept_bundle_holds(bundle, name[:200], digest, identities, trusted_root)
    except ValueError:
        return "its kept Sigstore bundle is not base64: pull it again to verify it"
    except ModelRunnerError as exc:
        return f"its kept Sigstore bundle does not hold: {exc.message}"
    return None


@functools.lru_cache(maxsize=256)
def _kept_bundle_holds(
    bundle: str, name: str, digest: str, identities: tuple[tuple[str, str], ...], trusted_root: str | None
) -> None:
    """Raises when the kept bundle does not hold. Only a bundle that held is remembered (a raise is not
    cached): the check before a load runs for every request, and a refusal that came from this machine (no
    local copy of Sigstore's root yet) is not kept after its cause is gone."""
    signers = [keyless.Identity(identity, issuer) for identity, issuer in identities]
    root = keyless.load_trusted_root(trusted_root, offline=True)
    keyless.verify_bundles([base64.b64decode(bundle, validate=True)], name, digest, signers, root)


def problem_before_load(store: ModelStore, model: StoredModel, rule: Rule | None = None) -> str | None:
    """Why the recorded verification does not cover the model as it is now (and, given the rule in force,
    who signed it is not trusted by it); None when it does."""
    record = read_record(store, model.id)
    if record is None or record.digest != model.id:
        return "it has no verified signature in the store (pull it from a registry where it is signed)"
    if rule is not None:
        problem = signer_problem(record, model.id, rule)
        if problem is not None:
            return problem
    for blob in model.manifest.blobs:
        try:
            now = _stat(store.layout.blob_path(blob.digest))
        except OSError:
            return f"blob {blob.digest[:19]} is missing"
        was = record.blobs.get(blob.digest)
        if was is not None and len(was) < len(now):  # a record of before ctime: it cannot say
            return (
                "its verification record predates the check of status-change times: check its blobs "
                "again with `model verify --deep` (or pull it again)"
            )
        if was != now:
            return (
                f"blob {blob.digest[:19]} changed in the store since it was verified (`model verify "
                "--deep` says whether its content is still the signed one)"
            )
    return None


def check_before_load(store: ModelStore, model: StoredModel) -> None:
    """Refuse (UntrustedModel) a model under an enforce rule whose verification does not hold now, under
    the policy in force now."""
    rule = _strictest(model.tags, load_rules(policy_path(config.runner_home())))
    if rule is None or rule.mode == "off":
        return
    problem = problem_before_load(store, model, rule)
    if problem is None:
        return
    name = model.tags[0] if model.tags else model.id
    message = f"{name} is not run: {problem} (trust policy {rule.pattern})"
    if rule.mode == "enforce":
        log.warning("load refused: %s", message)
        raise UntrustedModel(message)
    log.warning("loading anyway (trust policy mode warn): %s", message)
