"""What the store keeps of a verification, and the check before a load.

A pull that verified a signature records, next to the store's index (`signatures/<hex>.json`), the signed
manifest digest, the signer, when, and each blob file's size, inode and modification time. Before a model
is loaded under an `enforce` rule, its id must be that digest and its blob files must be as recorded: a blob
changed in the store, or a model packaged locally without a signature, does not run. The signed payload
and its signature are kept too, so that `model verify --local` checks them again offline against a key
(signing/local.py), and `--deep` hashes the blobs again; the load check never does.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner import config
from modelrunner.reference import parse_reference
from modelrunner.signing.policy import Rule, UntrustedModel, load_rules, policy_path, rule_for
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
    blobs: dict[str, list[int]]  # digest -> [size, inode, mtime_ns]
    payload: str = ""  # base64 of the signed simple-signing payload ("" in records of the first round)
    signature: str = ""  # base64 of its ECDSA signature

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
    return [info.st_size, info.st_ino, info.st_mtime_ns]


def record_verification(store: ModelStore, model: StoredModel, verified: Verified) -> None:
    from modelrunner.fileio import write_file_atomic

    blobs = {b.digest: _stat(store.layout.blob_path(b.digest)) for b in model.manifest.blobs}
    kept = verified.signature
    record = Record(
        verified.digest,
        verified.signer,
        verified.docker_reference,
        time.time(),
        blobs,
        base64.b64encode(kept.payload).decode() if kept else "",
        base64.b64encode(kept.signature).decode() if kept else "",
    )
    path = _record_path(store, model.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomic(path, json.dumps(record.__dict__).encode())


def read_record(store: ModelStore, model_id: str) -> Record | None:
    try:
        document: Any = json.loads(_record_path(store, model_id).read_bytes())
        return Record(**document)
    except (OSError, ValueError, TypeError):
        return None


def listed_with_verification(store: ModelStore, models: list[StoredModel]) -> list[dict[str, Any]]:
    """`with_verification` of every model of a listing, reading a record only where its file is there: one
    listing of the folder instead of a failed open per unsigned model (1,000 models: bench/growth.py)."""
    try:
        recorded = set(os.listdir(store.layout.root / RECORDS_DIR))
    except OSError:
        recorded = set()
    return [
        with_verification(store, model.to_api()) if _record_name(model.id) in recorded else model.to_api()
        for model in models
    ]


def with_verification(store: ModelStore, model: dict[str, Any]) -> dict[str, Any]:
    """DMR's model object, plus `verification` where the store holds one (absent otherwise, so that an
    unsigned model's object is DMR's byte for byte)."""
    record = read_record(store, str(model["id"]))
    if record is None or record.digest != model["id"]:
        return model
    return {**model, "verification": record.to_api()}


def _strictest(model: StoredModel) -> Rule | None:
    rules = load_rules(policy_path(config.runner_home()))
    if not rules:
        return None
    order = {"enforce": 0, "warn": 1, "off": 2}
    matched = [rule_for(rules, parse_reference(tag)) for tag in model.tags]
    found = [r for r in matched if r is not None]
    return min(found, key=lambda r: order[r.mode], default=None)


def problem_before_load(store: ModelStore, model: StoredModel) -> str | None:
    """Why the recorded verification does not cover the model as it is now; None when it does."""
    record = read_record(store, model.id)
    if record is None or record.digest != model.id:
        return "it has no verified signature in the store (pull it from a registry where it is signed)"
    for blob in model.manifest.blobs:
        try:
            now = _stat(store.layout.blob_path(blob.digest))
        except OSError:
            return f"blob {blob.digest[:19]} is missing"
        if record.blobs.get(blob.digest) != now:
            return f"blob {blob.digest[:19]} changed in the store since it was verified"
    return None


def check_before_load(store: ModelStore, model: StoredModel) -> None:
    """Refuse (UntrustedModel) a model under an enforce rule whose verification does not hold now."""
    rule = _strictest(model)
    if rule is None or rule.mode == "off":
        return
    problem = problem_before_load(store, model)
    if problem is None:
        return
    name = model.tags[0] if model.tags else model.id
    message = f"{name} is not run: {problem} (trust policy {rule.pattern})"
    if rule.mode == "enforce":
        log.warning("load refused: %s", message)
        raise UntrustedModel(message)
    log.warning("loading anyway (trust policy mode warn): %s", message)
