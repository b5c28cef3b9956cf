"""The config blob of a model artifact (contract 3.2): writing ours, reading ours and CNCF's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelrunner.artifact import mediatypes as mt
from modelrunner.errors import InvalidArtifact

MAX_CONFIG_BYTES = 16 * 1024 * 1024


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_config_blob(model: dict[str, Any], diff_ids: list[str], created: datetime) -> bytes:
    """Serialise a Docker-format config. `model` is the inner "config" object (format, sizes, metadata)."""
    doc = {
        "config": model,
        "descriptor": {"created": rfc3339(created)},
        "rootfs": {"type": "rootfs", "diff_ids": diff_ids},
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=False).encode()


@dataclass(frozen=True)
class ModelConfig:
    """What the API shows of a model: the inner config object, normalised, and its creation time."""

    config: dict[str, Any]
    created: int  # unix seconds

    @property
    def format(self) -> str:
        return str(self.config.get("format", ""))

    @property
    def context_size(self) -> int | None:
        value = self.config.get("context_size")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse_time(value: Any) -> int:
    if not isinstance(value, str) or not value:
        return 0
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0


def _load_json(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidArtifact("model config is too large")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArtifact("model config is not valid JSON") from None
    if not isinstance(doc, dict):
        raise InvalidArtifact("model config is not a JSON object")
    return doc


def parse_config_blob(data: bytes, media_type: str) -> ModelConfig:
    doc = _load_json(data)
    if media_type == mt.CONFIG_CNCF:
        return _from_cncf(doc)
    inner = doc.get("config")
    if not isinstance(inner, dict):
        raise InvalidArtifact("model config has no config object")
    if inner.get("format") == "diffusers":  # legacy name of the DDUF format
        inner = {**inner, "format": mt.FORMAT_DDUF}
    descriptor = doc.get("descriptor")
    created = _parse_time(descriptor.get("created")) if isinstance(descriptor, dict) else 0
    return ModelConfig(config=inner, created=created)


def _from_cncf(doc: dict[str, Any]) -> ModelConfig:
    """CNCF ModelPack configs are camelCase; map them to the Docker shape the API serves."""
    raw = doc.get("config")
    inner: dict[str, Any] = raw if isinstance(raw, dict) else {}
    descriptor = doc.get("descriptor")
    desc: dict[str, Any] = descriptor if isinstance(descriptor, dict) else {}
    family = desc.get("family") or inner.get("architecture") or ""
    config: dict[str, Any] = {
        "format": str(inner.get("format", "")),
        "quantization": str(inner.get("quantization", "")),
        "parameters": str(inner.get("paramSize", "")),
        "architecture": str(family),
        "size": "",
    }
    return ModelConfig(config=config, created=_parse_time(desc.get("createdAt")))


def with_context_size(data: bytes, context_size: int) -> bytes:
    """A Docker-format config blob with its context size replaced; everything else kept byte for byte
    in meaning (re-serialised)."""
    doc = _load_json(data)
    inner = doc.get("config")
    if not isinstance(inner, dict):
        raise InvalidArtifact("model config has no config object")
    inner["context_size"] = context_size
    return json.dumps(doc, separators=(",", ":")).encode()
