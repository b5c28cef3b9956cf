"""Keyless (Fulcio/Rekor) signatures: a Sigstore bundle that `cosign sign` (v3) stores as an OCI referrer of
the model's manifest (artifact type `application/vnd.dev.sigstore.bundle.v0.3+json`, the bundle its one
layer), verified with sigstore-python's `Verifier.verify_dsse` against a trusted root, offline: the leaf
certificate chains to the root's Fulcio CA at the time the log entry was integrated and carries an SCT of
one of its CT logs; the log entry's inclusion proof, checkpoint and promise are signed by one of its Rekor
logs (Rekor is never asked); the certificate names the identity (SAN) and OIDC issuer asked for; the DSSE
envelope is signed by the certificate's key. Then the envelope's in-toto statement must name this manifest
digest as its subject.

The library is the `keyless` extra (`pip install 'modelrunner[keyless]'`): imported only here, when asked.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner.distribution.registry import RegistryClient
from modelrunner.errors import BadRequest
from modelrunner.reference import Reference
from modelrunner.signing.payload import InvalidSignature
from modelrunner.signing.registry import (
    Verified,
    layers_of,
    read_layer,
    referrer_manifests,
    resolve_digest,
)

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
IN_TOTO = "application/vnd.in-toto+json"
MAX_BUNDLE_BYTES = 256 * 1024  # a bundle is a certificate, a log entry and an envelope: a few KiB
MAX_TRUSTED_ROOT_BYTES = 1024 * 1024
# What sigstore-python and the parsers under it raise on a bundle or trusted root that does not hold
_LIBRARY_ERRORS = (ValueError, TypeError, KeyError, IndexError)


class MissingKeylessSupport(BadRequest):
    """sigstore-python is not installed."""


@dataclass(frozen=True)
class Identity:
    """Who must have signed: the certificate's SAN (an e-mail or URI) and its OIDC issuer."""

    identity: str
    issuer: str


def _sigstore() -> Any:
    try:
        import sigstore.errors
        import sigstore.models
        import sigstore.verify
    except ImportError:
        raise MissingKeylessSupport(
            "keyless verification needs sigstore: pip install 'modelrunner[keyless]'"
        ) from None
    return sigstore


def load_trusted_root(text: str | None, offline: bool = False) -> Any:
    """A `sigstore.models.TrustedRoot` from trusted_root.json's text; None: Sigstore's public-good
    instance, through its TUF repository (the network), or its local copy alone where `offline`."""
    sigstore = _sigstore()
    errors = (sigstore.errors.Error, *_LIBRARY_ERRORS)
    try:
        if text is None:
            return sigstore.models.ClientTrustConfig.production(offline=offline).trusted_root
        from sigstore_models.trustroot import v1

        return sigstore.models.TrustedRoot(v1.TrustedRoot.from_json(text))
    except errors as exc:
        raise InvalidSignature(f"the trusted root does not hold: {str(exc)[:300]}") from None


def read_trusted_root(path: Path) -> str:
    """The text of a trusted_root.json file, size-capped and checked to parse."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_TRUSTED_ROOT_BYTES + 1)
    except OSError as exc:
        raise InvalidSignature(f"cannot read the trusted root {path}: {exc.strerror}") from None
    if len(data) > MAX_TRUSTED_ROOT_BYTES:
        raise InvalidSignature(f"the trusted root {path} is too large")
    text = data.decode("utf-8", "replace")
    load_trusted_root(text)
    return text


def read_bundles(client: RegistryClient, repository: str, digest: str) -> list[bytes]:
    """The Sigstore bundles stored as referrers of `digest` (each hash-checked, size-capped); [] when
    there are none or the registry has no referrers API."""
    found = []
    for document in referrer_manifests(client, repository, digest, BUNDLE_MEDIA_TYPE):
        for layer in layers_of(document):
            if layer.media_type != BUNDLE_MEDIA_TYPE:
                continue
            if layer.size > MAX_BUNDLE_BYTES:
                raise InvalidSignature("a Sigstore bundle is too large")
            found.append(read_layer(client, repository, layer, "Sigstore bundle"))
    return found


def _subject_names(payload: bytes, digest: str) -> list[str]:
    """The names of the in-toto statement's subjects whose digest is `digest`."""
    try:
        statement = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise InvalidSignature("the bundle's statement is not JSON") from None
    subjects = statement.get("subject") if isinstance(statement, dict) else None
    if not isinstance(subjects, list):
        raise InvalidSignature("the bundle's statement has no subject")
    algorithm, _, value = digest.partition(":")
    return [
        str(s.get("name", ""))
        for s in subjects
        if isinstance(s, dict) and isinstance(s.get("digest"), dict) and s["digest"].get(algorithm) == value
    ]


def verify_bundles(
    bundles: list[bytes], name: str, digest: str, identities: list[Identity], trusted_root: Any
) -> Verified:
    """The first bundle that one of `identities` signed for `digest` (the manifest of the model `name`),
    kept in what is returned; InvalidSignature (the reason the last one failed) otherwise."""
    if not bundles:
        raise InvalidSignature(f"{name} has no Sigstore bundle for {digest}")
    sigstore = _sigstore()
    from sigstore.verify.policy import AnyOf, VerificationPolicy
    from sigstore.verify.policy import Identity as IdentityPolicy

    policies: list[VerificationPolicy] = [
        IdentityPolicy(identity=i.identity, issuer=i.issuer) for i in identities
    ]
    policy = policies[0] if len(policies) == 1 else AnyOf(policies)  # one: its own reason on failure
    errors = (sigstore.errors.Error, *_LIBRARY_ERRORS)
    verifier = sigstore.verify.Verifier(trusted_root=trusted_root)
    reason = "no bundle"
    for raw in bundles:
        try:
            bundle = sigstore.models.Bundle.from_json(raw)
            payload_type, payload = verifier.verify_dsse(bundle, policy)
        except errors as exc:
            reason = str(exc)[:300]
            continue
        if payload_type != IN_TOTO:
            reason = f"the bundle's envelope holds {payload_type[:80]}, not an in-toto statement"
            continue
        names = _subject_names(payload, digest)
        if not names:
            reason = f"the bundle is for another manifest, not {digest}"
            continue
        return Verified(digest, _signer(bundle.signing_certificate, identities), names[0], bundle=raw)
    raise InvalidSignature(f"{name}@{digest}: {reason}")


def _signer(certificate: Any, identities: list[Identity]) -> str:
    """The identity (of those asked for) that the verified certificate names, as `identity (issuer)`."""
    from cryptography import x509

    sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    named = {str(v) for v in sans.get_values_for_type(x509.RFC822Name)}
    named |= {str(v) for v in sans.get_values_for_type(x509.UniformResourceIdentifier)}
    match = next((i for i in identities if i.identity in named), identities[0])
    return f"{match.identity} ({match.issuer})"


def verify_reference_keyless(
    reference: Reference,
    identities: list[Identity],
    trusted_root: Any,
    client: RegistryClient | None = None,
) -> Verified:
    """Check `reference` in its registry against the identities, by the bundles stored beside it."""
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(RegistryClient(reference.registry))
        digest = resolve_digest(client, reference)
        bundles = read_bundles(client, reference.repository, digest)
        return verify_bundles(bundles, reference.name, digest, identities, trusted_root)
