"""Signatures as OCI 1.1 referrers, as `cosign sign --registry-referrers-mode=oci-1-1` stores them: one
manifest per signature, `artifactType` cosign's signature type, the empty config, one simple-signing layer,
and `subject` the signed manifest; the registry lists it at `GET /v2/<name>/referrers/<digest>`. A
registry without that API answers 404 there, and signatures go to the `.sig` tag (signing/registry.py).

Everything read here is untrusted: the index is size-capped and only its signature entries are fetched,
at most MAX_SIGNATURES of them; an entry that names the signed manifest itself (a loop) and a referrer
whose subject is another manifest are refused. Referrers are never followed past one level.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any
from urllib.parse import quote

from modelrunner.artifact import mediatypes as mt
from modelrunner.distribution.registry import (
    OCI_INDEX,
    RegistryClient,
    pull_scope,
    raise_for_status,
    read_capped,
)
from modelrunner.errors import InvalidArtifact
from modelrunner.signing.payload import InvalidSignature

SIGNATURE_ARTIFACT_TYPE = "application/vnd.dev.cosign.artifact.sig.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
MAX_INDEX_BYTES = 256 * 1024
MAX_SIGNATURE_REFERRERS = 64
_UNSUPPORTED = (400, 404, 405, 406)  # what registries without the referrers API answer on that route


def referrers_index(
    client: RegistryClient, repository: str, digest: str, artifact_type: str = SIGNATURE_ARTIFACT_TYPE
) -> list[Any] | None:
    """The `manifests` of the registry's referrers index of `digest` (of `artifact_type`: the registry
    may filter); None where the registry has no referrers API."""
    response = client.request(
        "GET",
        f"/v2/{repository}/referrers/{digest}?artifactType={quote(artifact_type, safe='')}",
        [pull_scope(repository)],
        headers={"Accept": OCI_INDEX},
        stream=True,
    )
    with contextlib.closing(response):
        if response.status_code in _UNSUPPORTED:
            return None
        raise_for_status(response, f"{client.registry}/{repository} referrers of {digest[:19]}")
        media_type = response.headers.get("content-type", "").split(";")[0].strip()
        if media_type != OCI_INDEX:
            return None  # a registry that answers the route with something else does not serve it
        try:
            data = read_capped(response.iter_bytes(), MAX_INDEX_BYTES, "referrers index")
        except InvalidArtifact:
            raise InvalidSignature("the referrers index is too large") from None
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidSignature("the referrers index is not JSON") from None
    manifests = document.get("manifests") if isinstance(document, dict) else None
    if not isinstance(manifests, list):
        raise InvalidSignature("the referrers index has no manifests")
    return manifests


def signature_referrers(
    manifests: list[Any], digest: str, artifact_type: str = SIGNATURE_ARTIFACT_TYPE
) -> list[str]:
    """The digests of the index's referrers of `artifact_type` (cosign's signatures, or Sigstore bundles:
    signing/keyless.py), each once; a loop or too many is refused."""
    found: list[str] = []
    for entry in manifests:
        if not isinstance(entry, dict) or entry.get("artifactType") != artifact_type:
            continue
        referrer = entry.get("digest")
        if not isinstance(referrer, str):
            raise InvalidSignature("a referrer in the referrers index has no digest")
        if referrer == digest:
            raise InvalidSignature(
                f"the referrers index of {digest[:19]} lists that manifest itself (a loop)"
            )
        if referrer not in found:
            found.append(referrer)
        if len(found) > MAX_SIGNATURE_REFERRERS:
            raise InvalidSignature(f"more than {MAX_SIGNATURE_REFERRERS} signature referrers")
    return found


def check_subject(document: dict[str, Any], digest: str) -> None:
    """A referrer must name the manifest it was listed for as its subject."""
    subject = document.get("subject")
    named = subject.get("digest") if isinstance(subject, dict) else None
    if named != digest:
        raise InvalidSignature(f"a signature referrer's subject is {str(named)[:80]}, not {digest}")


def referrer_manifest(subject: dict[str, Any], config_digest: str, layer: dict[str, Any]) -> bytes:
    """One signature as cosign's oci-1-1 mode writes it."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "artifactType": SIGNATURE_ARTIFACT_TYPE,
        "config": {"mediaType": OCI_EMPTY, "size": len(EMPTY_CONFIG), "digest": config_digest},
        "layers": [layer],
        "subject": subject,
    }
    return json.dumps(manifest, separators=(",", ":")).encode()
