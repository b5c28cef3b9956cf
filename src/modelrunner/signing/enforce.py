"""The trust policy applied to a pull: after the manifest is resolved and before any blob is stored, the
signatures of its digest are checked against the keys of the rule that matches (signing/policy.py), or
its Sigstore bundles against the rule's keyless identities (signing/keyless.py). `enforce` refuses the
pull (HTTP 403, in the stream and the CLI), `warn` pulls and says so, in the stream and in the log. The
signature check costs the `.sig` manifest and one small payload per signature, never a second hash of
the blobs: the store verifies each blob's digest as it arrives, and the digests are what the signed
manifest names.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from modelrunner import config
from modelrunner.distribution.progress import ProgressReporter
from modelrunner.distribution.pull import RegistryPull
from modelrunner.distribution.registry import RegistryClient
from modelrunner.errors import ModelRunnerError
from modelrunner.reference import Reference
from modelrunner.signing import keyless
from modelrunner.signing.policy import Rule, UntrustedModel, load_rules, policy_path, rule_for
from modelrunner.signing.record import record_verification
from modelrunner.signing.registry import Verified, read_signatures, verify_signatures

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckedPull:
    verified: Verified
    started_ns: int  # before any blob was stored: a blob file whose ctime is older was not written by it


def check_pull(pull: RegistryPull, reporter: ProgressReporter) -> CheckedPull | None:
    """Apply the policy to a resolved pull; raises UntrustedModel where the rule enforces. The verified
    signature, if one was checked and held."""
    started_ns = time.time_ns()
    rule = rule_for(load_rules(policy_path(config.runner_home())), pull.reference)
    if rule is None or rule.mode == "off":
        return None
    assert pull.client is not None
    digest, reference = pull.model_id, pull.reference
    try:
        verified = verify_for_rule(pull.client, reference, digest, rule)
    except ModelRunnerError as exc:
        message = f"{reference.name}: signature check failed (trust policy {rule.pattern}): {exc.message}"
        if rule.mode == "enforce":
            log.warning("pull refused: %s", message)
            raise UntrustedModel(message) from None
        log.warning("pulling anyway (trust policy mode warn): %s", message)
        reporter.warning(f"{message} (trust policy mode warn: pulling anyway)")
        return None
    log.info("pull of %s@%s: signature verified, signer %s", reference.name, digest, verified.signer)
    reporter.status(f"Signature verified: signed by {verified.signer}")
    return CheckedPull(verified, started_ns)


def verify_for_rule(client: RegistryClient, reference: Reference, digest: str, rule: Rule) -> Verified:
    """A signature by one of the rule's keys, else a Sigstore bundle by one of its identities (the
    reason the last tried failed otherwise)."""
    if rule.keys:
        try:
            signatures = read_signatures(client, reference.repository, digest)
            return verify_signatures(signatures, reference, digest, rule.public_keys())
        except ModelRunnerError:
            if not rule.identities:
                raise
    identities = [keyless.Identity(identity, issuer) for identity, issuer in rule.identities]
    bundles = keyless.read_bundles(client, reference.repository, digest)
    return keyless.verify_bundles(
        bundles, reference.name, digest, identities, keyless.load_trusted_root(rule.trusted_root)
    )


def check_unsigned_source(reference: Reference, reporter: ProgressReporter) -> None:
    """A pull from a source that carries no signatures (Hugging Face): refused where the rule enforces,
    said where it warns, before anything is fetched."""
    rule = rule_for(load_rules(policy_path(config.runner_home())), reference)
    if rule is None or rule.mode == "off":
        return
    message = f"{reference.name}: Hugging Face models carry no signature (trust policy {rule.pattern})"
    if rule.mode == "enforce":
        log.warning("pull refused: %s", message)
        raise UntrustedModel(message)
    log.warning("pulling anyway (trust policy mode warn): %s", message)
    reporter.warning(f"{message} (trust policy mode warn: pulling anyway)")


def record_pull(pull: RegistryPull, checked: CheckedPull | None) -> None:
    """After the blobs are in the store: keep what was verified, for the check before each load (the blob
    files the pull found in the store hashed first)."""
    if checked is not None:
        model = pull.store.get(pull.model_id)
        record_verification(pull.store, model, checked.verified, checked.started_ns)
