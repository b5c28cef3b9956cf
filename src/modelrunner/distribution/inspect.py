"""`model inspect --remote`: a model's manifest and config read from its registry, without pulling it."""

from __future__ import annotations

import contextlib
from typing import Any

from modelrunner.artifact.manifest import parse_manifest, sha256_digest
from modelrunner.artifact.model_config import MAX_CONFIG_BYTES, parse_config_blob
from modelrunner.distribution.registry import RegistryClient, read_capped
from modelrunner.errors import BadRequest, InvalidArtifact
from modelrunner.reference import Reference


def inspect_remote(reference: Reference, bearer_token: str | None = None) -> dict[str, Any]:
    """The API's Model object ({id, created, config}) as the registry holds it; two small GETs."""
    if reference.is_huggingface:
        raise BadRequest(
            "--remote reads OCI registries; a Hugging Face model is only built when it is pulled"
        )
    with RegistryClient(reference.registry, bearer_token=bearer_token) as client:
        manifest_bytes, _ = client.get_manifest(
            reference.repository, reference.digest or reference.tag or "latest"
        )
        if reference.digest and sha256_digest(manifest_bytes) != reference.digest:
            raise InvalidArtifact("the registry sent a manifest that does not match the requested digest")
        manifest = parse_manifest(manifest_bytes)
        if manifest.config.size > MAX_CONFIG_BYTES:
            raise InvalidArtifact("the model's config blob is too large")
        response = client.open_blob(reference.repository, manifest.config.digest, 0)
        with contextlib.closing(response):
            config_bytes = read_capped(response.chunks(), MAX_CONFIG_BYTES, "config")
    if sha256_digest(config_bytes) != manifest.config.digest:
        raise InvalidArtifact("the registry sent a config that does not match its digest")
    config = parse_config_blob(config_bytes, manifest.config.media_type)
    # no "tags": as DMR's ToModelFromArtifact, a remote model has no local tags (omitted, Go's omitempty)
    return {
        "id": sha256_digest(manifest_bytes),
        "created": config.created,
        "config": config.config,
    }
