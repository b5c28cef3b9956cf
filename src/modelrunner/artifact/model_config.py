"""The config blob of a model artifact (contract 3.2): writing ours, reading ours and CNCF ModelPack ones
(modelpack.py writes and decodes those).

Docker-format configs are written as DMR writes them (`types.ConfigFile` through Go's encoding/json, see
artifact/gojson.py): `config` with its fields in `types.Config` order, empty ones left out, maps sorted;
`descriptor.created` as time.Time marshals; `rootfs`. The same model files therefore give the same config
bytes, and so the same model ID, as `docker model package`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from modelrunner.artifact import gojson, modelpack
from modelrunner.artifact import mediatypes as mt
from modelrunner.errors import InvalidArtifact

MAX_CONFIG_BYTES = 16 * 1024 * 1024
# types.Config (pkg/distribution/types/config.go), in declaration order; all `omitempty`.
_CONFIG_STRINGS = ("format", "quantization", "parameters", "architecture", "size")
_CONFIG_MAPS = ("gguf", "safetensors", "diffusers")
_INT32 = range(-(2**31), 2**31)


def _reencoded_time(value: Any) -> Any:
    """`created` after Go's unmarshal and marshal (gojson.remarshal_time); what Go could not read is kept
    as it was."""
    if not isinstance(value, str):
        return value
    try:
        return gojson.remarshal_time(value)
    except ValueError:
        return value


def go_model_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` as types.Config marshals: its fields in order, empty ones out, maps sorted, others dropped."""
    out: dict[str, Any] = {}
    for key in _CONFIG_STRINGS:
        value = config.get(key)
        if isinstance(value, str) and value:
            out[key] = value
    for key in _CONFIG_MAPS:
        value = config.get(key)
        if isinstance(value, Mapping) and value:
            out[key] = gojson.sorted_map({k: v for k, v in value.items() if isinstance(v, str)})
    context_size = config.get("context_size")
    if isinstance(context_size, int) and not isinstance(context_size, bool) and context_size in _INT32:
        out["context_size"] = context_size
    return out


def _config_file(config: Mapping[str, Any], descriptor: dict[str, Any], diff_ids: list[Any]) -> bytes:
    return gojson.dumps(
        {
            "config": go_model_config(config),
            "descriptor": descriptor,
            "rootfs": {"type": "rootfs", "diff_ids": diff_ids},
        }
    )


def make_config_blob(model: Mapping[str, Any], diff_ids: list[str], created: datetime) -> bytes:
    """Serialise a Docker-format config. `model` is the inner "config" object (format, sizes, metadata)."""
    return _config_file(model, {"created": gojson.time_text(created)}, list(diff_ids))


@dataclass(frozen=True)
class ModelConfig:
    """What the API shows of a model: the inner config object, normalised, and its creation time.

    `inferred_format`: for a ModelPack config that names no format, the one its layers' file names say
    (what DMR's bundle and engines go by, while its API shows the config as it is). `modelpack`: the blob is
    a ModelPack config (modelpack.is_modelpack_config)."""

    config: dict[str, Any]
    created: int  # unix seconds
    inferred_format: str = ""
    modelpack: bool = False

    @property
    def format(self) -> str:
        return str(self.config.get("format", "")) or self.inferred_format

    @property
    def context_size(self) -> int | None:
        value = self.config.get("context_size")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse_time(value: Any) -> int:
    if not isinstance(value, str) or not value:
        return 0
    try:
        return int(gojson.parse_time(value).timestamp())
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


def parse_config_blob(
    data: bytes, media_type: str, layers: Iterable[tuple[str, str | None]] = ()
) -> ModelConfig:
    """A config blob, Docker-format or ModelPack. Which one is decided by its content, as DMR decides
    (partial.Config: modelpack.IsModelPackConfig), whatever `media_type` says. `layers`: the model's
    (media type, file path) pairs, for a ModelPack config that names no format."""
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidArtifact("model config is too large")
    if modelpack.is_modelpack_config(data):
        return _from_modelpack(data, layers)
    doc = _load_json(data)
    inner = doc.get("config")
    if not isinstance(inner, dict):
        raise InvalidArtifact("model config has no config object")
    if inner.get("format") == "diffusers":  # legacy name of the DDUF format
        inner = {**inner, "format": mt.FORMAT_DDUF}
    descriptor = doc.get("descriptor")
    created = _parse_time(descriptor.get("created")) if isinstance(descriptor, dict) else 0
    return ModelConfig(config=inner, created=created)


def _from_modelpack(data: bytes, layers: Iterable[tuple[str, str | None]]) -> ModelConfig:
    """A ModelPack config in the Docker shape the API serves (DMR's normalizeConfig)."""
    model = modelpack.decode(data)
    config = modelpack.normalised_config(model)
    if config.get("format") == "diffusers":
        config["format"] = mt.FORMAT_DDUF
    inferred = "" if config.get("format") else modelpack.infer_format(layers)
    return ModelConfig(config, _parse_time(model["descriptor"]["createdAt"]), inferred, modelpack=True)


def reencode_config(data: bytes, context_size: int | None = None, more_diff_ids: Iterable[str] = ()) -> bytes:
    """A Docker-format config blob as DMR's mutate package rewrites it (`rawDockerConfigFile`): read into
    types.ConfigFile and marshalled again, with new layers' diff IDs appended and the context size set."""
    doc = _load_json(data)
    inner = doc.get("config")
    if not isinstance(inner, dict):
        raise InvalidArtifact("model config has no config object")
    if context_size is not None:
        inner = {**inner, "context_size": context_size}
    descriptor = doc.get("descriptor")
    created = descriptor.get("created") if isinstance(descriptor, dict) else None
    rootfs = doc.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    return _config_file(
        inner,
        {"created": _reencoded_time(created)} if created is not None else {},
        [d for d in diff_ids or [] if isinstance(d, str)] + list(more_diff_ids),
    )


def with_context_size(data: bytes, context_size: int) -> bytes:
    """A Docker-format config blob with its context size replaced (DMR's lightweight repackage)."""
    return reencode_config(data, context_size)
