"""Signatures in a registry where cosign and containers/image keep them: OCI 1.1 referrers of the signed
manifest where the registry serves the referrers API (signing/referrers.py), else the manifest tagged
`sha256-<hex>.sig` beside the signed one, one layer per signature (the payload blob, the signature in its
`dev.cosignproject.cosign/signature` annotation). Signing adds a referrer, or appends a layer to the tag;
verifying reads the referrers, then the tag, and accepts the first that one of the keys signed for this
digest and repository.

Everything read here is untrusted: the signature manifest and each payload are size-capped, counted and
hash-checked before anything is parsed.
"""

from __future__ import annotations

import base64
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.manifest import Descriptor, parse_descriptor, sha256_digest
from modelrunner.distribution.registry import RegistryClient, push_scope, read_capped
from modelrunner.errors import InvalidArtifact, InvalidReference, ModelNotFound
from modelrunner.reference import Reference, parse_reference
from modelrunner.signing import keys, referrers
from modelrunner.signing.payload import MAX_PAYLOAD_BYTES, InvalidSignature, make_payload, parse_payload

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
OCI_IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
MAX_SIGNATURE_MANIFEST_BYTES = 256 * 1024
MAX_SIGNATURES = 64
MAX_SIGNATURE_BYTES = 1024  # an ECDSA P-256 DER signature is at most 72 bytes


def signature_tag(digest: str) -> str:
    """`sha256:<hex>` -> `sha256-<hex>.sig`, cosign's tag for the signatures of that manifest."""
    return digest.replace(":", "-") + ".sig"


@dataclass(frozen=True)
class Signature:
    payload: bytes
    signature: bytes


@dataclass(frozen=True)
class Verified:
    digest: str
    signer: str  # keys.key_id of the key that signed
    docker_reference: str
    signature: Signature | None = None  # what was checked, kept by the store to check it again offline
    bundle: bytes | None = None  # a keyless signature's Sigstore bundle, kept likewise (signing/record.py)


def resolve_digest(client: RegistryClient, reference: Reference) -> str:
    """The digest of the manifest `reference` names in the registry (checked against `@digest` if given)."""
    return str(_resolve(client, reference)["digest"])


def _resolve(client: RegistryClient, reference: Reference) -> dict[str, Any]:
    """The descriptor of the manifest `reference` names (a referrer's `subject`)."""
    data, media_type = client.get_manifest(
        reference.repository, reference.digest or reference.tag or "latest"
    )
    digest = sha256_digest(data)
    if reference.digest and digest != reference.digest:
        raise InvalidArtifact("the registry sent a manifest that does not match the requested digest")
    return {"mediaType": media_type or mt.OCI_MANIFEST, "digest": digest, "size": len(data)}


def _signature_manifest(client: RegistryClient, repository: str, digest: str) -> dict[str, Any] | None:
    """The parsed `.sig` manifest, None when there is none."""
    try:
        data, _ = client.get_manifest(repository, signature_tag(digest))
    except ModelNotFound:
        return None
    except InvalidArtifact:
        raise InvalidSignature("the signature manifest is too large") from None
    return _parse_signature_manifest(data)


def _parse_signature_manifest(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_SIGNATURE_MANIFEST_BYTES:
        raise InvalidSignature("the signature manifest is too large")
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidSignature("the signature manifest is not JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("layers"), list):
        raise InvalidSignature("the signature manifest has no layers")
    if len(document["layers"]) > MAX_SIGNATURES:
        raise InvalidSignature(f"the signature manifest has more than {MAX_SIGNATURES} signatures")
    return document


def referrer_manifests(
    client: RegistryClient,
    repository: str,
    digest: str,
    artifact_type: str = referrers.SIGNATURE_ARTIFACT_TYPE,
) -> list[dict[str, Any]]:
    """The referrers of `digest` of `artifact_type`, each hash-checked and naming it as subject; [] where
    the registry has no referrers API."""
    listed = referrers.referrers_index(client, repository, digest, artifact_type)
    documents = []
    for referrer in referrers.signature_referrers(listed or [], digest, artifact_type):
        try:
            data, _ = client.get_manifest(repository, referrer)
        except InvalidArtifact:
            raise InvalidSignature("a signature referrer is too large") from None
        if sha256_digest(data) != referrer:
            raise InvalidSignature(f"the signature referrer {referrer[:19]} does not match its digest")
        document = _parse_signature_manifest(data)
        referrers.check_subject(document, digest)
        documents.append(document)
    return documents


def layers_of(document: dict[str, Any]) -> list[Descriptor]:
    try:
        return [parse_descriptor(raw, f"signature {i}") for i, raw in enumerate(document["layers"])]
    except InvalidArtifact as exc:
        raise InvalidSignature(f"the signature manifest is malformed: {exc.message}") from None


def read_signatures(client: RegistryClient, repository: str, digest: str) -> list[Signature]:
    """The signatures stored for `digest`, its referrers' then its `.sig` tag's (payloads fetched and
    hash-checked); [] when there are none."""
    documents = referrer_manifests(client, repository, digest)
    tagged = _signature_manifest(client, repository, digest)
    found = []
    for document in [*documents, *([tagged] if tagged is not None else [])]:
        found.extend(_signatures_in(client, repository, document))
    return found


def _signatures_in(client: RegistryClient, repository: str, document: dict[str, Any]) -> list[Signature]:
    found = []
    for layer in layers_of(document):
        encoded = layer.annotations.get(SIGNATURE_ANNOTATION)
        if layer.media_type != SIMPLE_SIGNING or encoded is None:
            continue
        if layer.size > MAX_PAYLOAD_BYTES or len(encoded) > MAX_SIGNATURE_BYTES:
            raise InvalidSignature("a signature in the signature manifest is too large")
        try:
            signature = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise InvalidSignature("a signature annotation is not base64") from None
        found.append(Signature(read_layer(client, repository, layer, "signature payload"), signature))
    return found


def read_layer(client: RegistryClient, repository: str, layer: Descriptor, what: str) -> bytes:
    """A small layer of a signature manifest (its size checked by the caller), read no further than its
    declared size and hash-checked."""
    response = client.open_blob(repository, layer.digest, 0)
    with contextlib.closing(response):
        try:
            data = read_capped(response.chunks(), layer.size, what)
        except InvalidArtifact:
            raise InvalidSignature(f"a {what} is larger than its manifest says") from None
    if len(data) != layer.size or sha256_digest(data) != layer.digest:
        raise InvalidSignature(f"a {what} does not match its digest")
    return data


def _same_repository(docker_reference: str, reference: Reference) -> bool:
    try:
        signed = parse_reference(docker_reference)
    except InvalidReference:
        return False
    return (signed.registry, signed.repository) == (reference.registry, reference.repository)


def verify_signatures(
    signatures: list[Signature],
    reference: Reference,
    digest: str,
    public_keys: list[ec.EllipticCurvePublicKey],
) -> Verified:
    """The first signature that a key made over `digest` for this repository; InvalidSignature (the
    reason the last one failed) otherwise."""
    if not signatures:
        raise InvalidSignature(f"{reference.name} is not signed (no signature for {digest})")
    reason = "no signature was made by the given key"
    for signature in signatures:
        key = next(
            (k for k in public_keys if keys.signature_valid(k, signature.signature, signature.payload)), None
        )
        if key is None:
            continue
        claim = parse_payload(signature.payload)
        if claim.manifest_digest != digest:
            reason = f"the signature is for another manifest ({claim.manifest_digest}), not {digest}"
            continue
        if not _same_repository(claim.docker_reference, reference):
            reason = f"the signature is for another repository ({claim.docker_reference[:200]})"
            continue
        return Verified(digest, keys.key_id(key), claim.docker_reference, signature)
    raise InvalidSignature(f"{reference.name}@{digest}: {reason}")


def verify_reference(
    reference: Reference, public_keys: list[ec.EllipticCurvePublicKey], client: RegistryClient | None = None
) -> Verified:
    """Check `reference` in its registry against the keys."""
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(RegistryClient(reference.registry))
        digest = resolve_digest(client, reference)
        return verify_signatures(
            read_signatures(client, reference.repository, digest), reference, digest, public_keys
        )


def _upload_blob(client: RegistryClient, repository: str, data: bytes) -> Descriptor:
    digest = sha256_digest(data)
    scopes = [push_scope(repository)]
    if not client.blob_exists(repository, digest, scopes):
        client.finish_upload(client.start_upload(repository), digest, scopes, data)
    return Descriptor(OCI_IMAGE_CONFIG, digest, len(data))


def _image_config(payload_digests: list[str]) -> bytes:
    """The config cosign writes beside its signature layers: an empty image whose layers are the payloads."""
    zero = "0001-01-01T00:00:00Z"
    document = {
        "architecture": "",
        "created": zero,
        "history": [{"created": zero}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": payload_digests},
        "config": {},
    }
    return json.dumps(document, separators=(",", ":")).encode()


def sign_reference(
    reference: Reference,
    private_key: ec.EllipticCurvePrivateKey,
    expected_digest: str | None = None,
    client: RegistryClient | None = None,
) -> Verified:
    """Sign the manifest `reference` names in its registry and store the signature beside it;
    `expected_digest` (what a push just sent) refuses to sign anything else the tag names by then."""
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(RegistryClient(reference.registry))
        subject = _resolve(client, reference)
        digest = str(subject["digest"])
        if expected_digest is not None and digest != expected_digest:
            raise InvalidSignature(
                f"{reference} names {digest} in the registry, not the pushed {expected_digest}"
            )
        identity = str(reference) if reference.tag and not reference.digest else reference.name
        payload = make_payload(identity, digest)
        signature = keys.sign(private_key, payload)
        repository = reference.repository
        payload_blob = _upload_blob(client, repository, payload)
        layer = {
            "mediaType": SIMPLE_SIGNING,
            "size": payload_blob.size,
            "digest": payload_blob.digest,
            "annotations": {SIGNATURE_ANNOTATION: base64.b64encode(signature).decode()},
        }
        if referrers.referrers_index(client, repository, digest) is not None:
            config = _upload_blob(client, repository, referrers.EMPTY_CONFIG)
            manifest = referrers.referrer_manifest(subject, config.digest, layer)
            client.put_manifest(repository, sha256_digest(manifest), manifest, mt.OCI_MANIFEST)
        else:
            _append_to_signature_tag(client, repository, digest, layer)
        return Verified(digest, keys.key_id(private_key.public_key()), identity)


def _append_to_signature_tag(
    client: RegistryClient, repository: str, digest: str, layer: dict[str, Any]
) -> None:
    """A registry without the referrers API: the signature joins the others in the `.sig` manifest."""
    existing = _signature_manifest(client, repository, digest)
    layers = [raw for raw in (existing or {}).get("layers", []) if isinstance(raw, dict)]
    layers = [*layers, layer][-MAX_SIGNATURES:]
    config = _upload_blob(client, repository, _image_config([str(raw.get("digest")) for raw in layers]))
    manifest = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "config": {"mediaType": OCI_IMAGE_CONFIG, "size": config.size, "digest": config.digest},
        "layers": layers,
    }
    client.put_manifest(repository, signature_tag(digest), json.dumps(manifest).encode(), mt.OCI_MANIFEST)
