"""OCI manifests of model artifacts: building them (the bytes DMR's builder writes: Go's encoding/json of
`oci.Manifest`, so a model ID is the same), and parsing untrusted ones.

Parsing is strict where safety is at stake (digests, sizes, file paths, limits) and lenient where DMR is:
a layer of a media type this version does not know (`gguf.v3.lora`, a newer model-spec type) is kept as a
blob of the model and otherwise ignored, as DMR ignores it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from modelrunner.artifact import gojson
from modelrunner.artifact import mediatypes as mt
from modelrunner.digest import validate_digest
from modelrunner.errors import InvalidArtifact, InvalidDigest, UnsupportedMediaType

MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_LAYERS = 10_000
MAX_BLOB_SIZE = 1 << 42  # 4 TiB: far beyond any model file, small enough to reject absurd sizes


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def filepath(self) -> str | None:
        return self.annotations.get(mt.ANNOTATION_FILEPATH)

    def to_json(self) -> dict[str, Any]:
        """oci.Descriptor's field order (mediaType, size, digest, annotations), map keys sorted."""
        out: dict[str, Any] = {"mediaType": self.media_type, "size": self.size, "digest": self.digest}
        if self.annotations:
            out["annotations"] = gojson.sorted_map(self.annotations)
        return out


@dataclass(frozen=True)
class Manifest:
    config: Descriptor
    layers: tuple[Descriptor, ...]
    media_type: str = mt.OCI_MANIFEST
    artifact_type: str | None = None

    @property
    def blobs(self) -> list[Descriptor]:
        """Layers then config: the files a model consists of, as the store's index lists them."""
        return [*self.layers, self.config]

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {"schemaVersion": 2, "mediaType": self.media_type}
        if self.artifact_type:
            doc["artifactType"] = self.artifact_type
        doc["config"] = self.config.to_json()
        doc["layers"] = [layer.to_json() for layer in self.layers]
        return gojson.dumps(doc)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def parse_descriptor(raw: Any, what: str) -> Descriptor:
    """One untrusted descriptor (a manifest's config or layer, `what` in messages); raises InvalidArtifact."""
    if not isinstance(raw, dict):
        raise InvalidArtifact(f"manifest {what} is not an object")
    media_type = raw.get("mediaType")
    digest = raw.get("digest")
    size = raw.get("size")
    if not isinstance(media_type, str) or not media_type:
        raise InvalidArtifact(f"manifest {what} has no media type")
    if not isinstance(digest, str):
        raise InvalidArtifact(f"manifest {what} has no digest")
    try:
        validate_digest(digest)
    except InvalidDigest as exc:
        raise InvalidArtifact(f"manifest {what}: {exc.message}") from None
    if isinstance(size, bool) or not isinstance(size, int) or size < 0 or size > MAX_BLOB_SIZE:
        raise InvalidArtifact(f"manifest {what} has an invalid size: {str(size)[:40]}")
    annotations = raw.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise InvalidArtifact(f"manifest {what} has invalid annotations")
    filepath = annotations.get(mt.ANNOTATION_FILEPATH)
    if filepath is not None:
        check_relative_path(filepath, what)
    return Descriptor(media_type, digest, size, dict(annotations))


def check_relative_path(path: str, what: str = "file") -> str:
    """A file path from an artifact must stay inside the bundle: relative, no `..`, no odd characters."""
    parts = path.split("/")
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or any(ord(c) < 32 for c in path)
        or any(p in ("", ".", "..") for p in parts)
        or len(path) > 1024
    ):
        raise InvalidArtifact(f"{what} has an unsafe file path: {path[:80]!r}")
    return path


def check_paths_distinct(paths: list[str]) -> None:
    """No two files at one path, and no file where another needs a folder (`a` and `a/b`)."""
    seen = set(paths)
    if len(seen) != len(paths):
        raise InvalidArtifact("two layers of the model have the same file path")
    for path in paths:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in seen:
                raise InvalidArtifact(f"layer path {path[:80]!r} lies under another layer's file")


def parse_manifest(data: bytes) -> Manifest:
    """Parse an untrusted manifest; raises InvalidArtifact or UnsupportedMediaType with a clear message."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise InvalidArtifact("manifest is too large")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArtifact("manifest is not valid JSON") from None
    if not isinstance(doc, dict):
        raise InvalidArtifact("manifest is not a JSON object")
    if doc.get("schemaVersion") != 2:
        raise InvalidArtifact("manifest schemaVersion must be 2")
    media_type = doc.get("mediaType", mt.OCI_MANIFEST)
    if not isinstance(media_type, str) or media_type not in mt.MANIFEST_TYPES:
        raise InvalidArtifact(f"unsupported manifest media type: {str(media_type)[:100]}")
    config = parse_descriptor(doc.get("config"), "config")
    if config.media_type not in mt.SUPPORTED_CONFIG_TYPES:
        raise UnsupportedMediaType(
            f"config type {config.media_type[:100]} is not supported by this version of modelrunner; "
            "try upgrading"
        )
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list) or not raw_layers:
        raise InvalidArtifact("manifest has no layers")
    if len(raw_layers) > MAX_LAYERS:
        raise InvalidArtifact("manifest has too many layers")
    layers = tuple(parse_descriptor(raw, f"layer {i}") for i, raw in enumerate(raw_layers))
    check_paths_distinct([layer.filepath for layer in layers if layer.filepath])
    artifact_type = doc.get("artifactType")
    return Manifest(
        config=config,
        layers=layers,
        media_type=media_type,
        artifact_type=artifact_type if isinstance(artifact_type, str) else None,
    )
