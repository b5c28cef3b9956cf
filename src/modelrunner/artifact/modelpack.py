"""CNCF ModelPack artifacts (`model package --format cncf`), byte for byte as DMR builds them.

DMR (`pkg/distribution/modelpack/`, `builder/builder.go`, `builder/from_directory.go`,
`internal/partial/cncf_model.go`, `internal/mutate/model.go`) builds the Docker-format artifact first and
then re-types it: every layer gets the model-spec media type of its kind (`MapLayerMediaType`: weights,
the multimodal projector included, are `weight.v1.raw`; templates, tokenizer and config files
`weight.config.v1.raw`; licences `doc.v1.raw`), and the config becomes a ModelPack `Model`
(`DockerConfigToModelPack`: the architecture as `family` and `architecture`, the parameters as
`paramSize`, the format and quantization; no size and no context size, which the spec lacks). The
manifest carries `artifactType` and the ModelPack config media type.

The config is Go's encoding/json of model-spec v0.0.7's `specs-go/v1.Model` (DMR's go.mod): fields in
declaration order, `omitempty` ones left out when empty, `modelfs.diffIds` always written. When DMR
appends layers to a ModelPack config (mutate's rawCNCFConfigFile, builder.convertToCNCF) it unmarshals
the config into that struct and marshals it again, which drops unknown fields and normalises times: so
does `reencode` here, with Go's decoding rules (keys matched case-insensitively, later duplicates win,
`null` leaves a value as it is, a value of the wrong JSON type is an error).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from modelrunner.artifact import gojson
from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.filetypes import FileType, classify_file, extension, weight_format
from modelrunner.errors import InvalidArtifact

if TYPE_CHECKING:
    from modelrunner.artifact.manifest import Manifest

__all__ = [
    "cncf_layer_media_type",
    "decode",
    "from_docker_config",
    "from_docker_config_blob",
    "infer_format",
    "is_mmproj_path",
    "is_modelpack_config",
    "is_modelpack_model",
    "normalised_config",
    "reencode",
]

WEIGHT_PREFIX = "application/vnd.cncf.model.weight."

# modelpack.ClassifyLayer's explicit cases, by media type.
_DOC = frozenset({mt.LICENSE, mt.CNCF_DOC_RAW})
_WEIGHT_CONFIG = frozenset({mt.CHAT_TEMPLATE, mt.VLLM_CONFIG_TAR, mt.MODEL_FILE, mt.CNCF_WEIGHT_CONFIG_RAW})
_WEIGHT = frozenset(
    {
        mt.MMPROJ,
        mt.GGUF,
        mt.SAFETENSORS,
        mt.DDUF,
        mt.CNCF_WEIGHT_RAW,
        mt.CNCF_WEIGHT_GGUF,
        mt.CNCF_WEIGHT_SAFETENSORS,
    }
)


def cncf_layer_media_type(media_type: str, filepath: str | None) -> str:
    """modelpack.MapLayerMediaType: the model-spec raw type of a layer's kind. Known media types decide
    alone; others go by the file path (files.Classify; `.md` files are documentation), and without one
    are weight config."""
    if media_type in _DOC:
        return mt.CNCF_DOC_RAW
    if media_type in _WEIGHT_CONFIG:
        return mt.CNCF_WEIGHT_CONFIG_RAW
    if media_type in _WEIGHT:
        return mt.CNCF_WEIGHT_RAW
    if not filepath:
        return mt.CNCF_WEIGHT_CONFIG_RAW
    kind = classify_file(filepath)
    if kind in (FileType.GGUF, FileType.SAFETENSORS, FileType.DDUF):
        return mt.CNCF_WEIGHT_RAW
    if kind is FileType.LICENSE or (kind is FileType.CONFIG and extension(filepath).lower() == ".md"):
        return mt.CNCF_DOC_RAW
    return mt.CNCF_WEIGHT_CONFIG_RAW


def is_mmproj_path(path: str) -> bool:
    """bundle.isMMProjFilePath: a generic weight whose file name says `mmproj` is a projector."""
    return "mmproj" in path.rsplit("/", 1)[-1].lower()


# --- Go's encoding/json over specs-go/v1.Model -----------------------------------------------------------

# A struct is a dict of JSON name -> (kind, omitempty). Kinds: "string", "strings" ([]string), "time"
# (*time.Time), "bool" (*bool), a nested struct (a value, never omitted), ("ptr", struct) (a pointer).
_Struct = dict[str, tuple[Any, bool]]

_CAPABILITIES: _Struct = {
    "inputTypes": ("strings", True),
    "outputTypes": ("strings", True),
    "knowledgeCutoff": ("time", True),
    "reasoning": ("bool", True),
    "toolUsage": ("bool", True),
    "embedding": ("bool", True),
    "reward": ("bool", True),
}
_CONFIG: _Struct = {
    "architecture": ("string", True),
    "format": ("string", True),
    "paramSize": ("string", True),
    "precision": ("string", True),
    "quantization": ("string", True),
    "capabilities": (("ptr", _CAPABILITIES), True),
}
_MODEL_FS: _Struct = {"type": ("string", False), "diffIds": ("strings", False)}
_DESCRIPTOR: _Struct = {
    "createdAt": ("time", True),
    "authors": ("strings", True),
    "family": ("string", True),
    "name": ("string", True),
    "docURL": ("string", True),
    "sourceURL": ("string", True),
    "version": ("string", True),
    "revision": ("string", True),
    "vendor": ("string", True),
    "licenses": ("strings", True),
    "title": ("string", True),
    "description": ("string", True),
}
# `config` is tagged omitempty, which Go ignores for a struct value: all three are always written.
_MODEL: _Struct = {
    "descriptor": (_DESCRIPTOR, False),
    "modelfs": (_MODEL_FS, False),
    "config": (_CONFIG, False),
}
# The part of types.ConfigFile (pkg/distribution/types/config.go) DockerConfigToModelPack reads.
_DOCKER_CONFIG_FILE: _Struct = {
    "config": (
        {
            "format": ("string", True),
            "quantization": ("string", True),
            "parameters": ("string", True),
            "architecture": ("string", True),
        },
        False,
    ),
    "descriptor": ({"created": ("time", True)}, False),
}

_SURROGATE = re.compile("[\ud800-\udfff]")


class _Object(list[tuple[str, Any]]):
    """A JSON object as its key/value pairs in document order (duplicates kept, as Go sees them)."""


def _bad(where: str, wanted: str) -> InvalidArtifact:
    return InvalidArtifact(f"model config: {where} is not {wanted}")


def _go_text(value: str) -> str:
    # Go's decoder turns an unpaired surrogate escape into U+FFFD; Python's keeps it (and cannot encode it).
    return _SURROGATE.sub("\ufffd", value)


def _zero(kind: Any) -> Any:
    if kind == "string":
        return ""
    if isinstance(kind, dict):
        return {name: _zero(inner) for name, (inner, _) in kind.items()}
    return None  # slices, pointers


def _decode_struct(spec: _Struct, current: dict[str, Any] | None, value: Any, where: str) -> dict[str, Any]:
    out = dict(current) if current is not None else _zero(spec)
    if value is None:
        return out
    if not isinstance(value, _Object):
        raise _bad(where, "an object")
    folded = {name.lower(): name for name in spec}
    for key, item in value:
        name = key if key in spec else folded.get(key.lower())
        if name is not None:
            out[name] = _decode_value(spec[name][0], out[name], item, f"{where}.{name}")
    return out


def _decode_value(kind: Any, current: Any, item: Any, where: str) -> Any:
    if isinstance(kind, dict):
        return _decode_struct(kind, current, item, where)
    if isinstance(kind, tuple):  # a pointer to a struct: null makes it nil, an object fills it
        return None if item is None else _decode_struct(kind[1], current, item, where)
    if item is None:
        return current if kind == "string" else None
    if kind == "string":
        if not isinstance(item, str):
            raise _bad(where, "a string")
        return _go_text(item)
    if kind == "strings":
        if not isinstance(item, list) or isinstance(item, _Object):
            raise _bad(where, "an array of strings")
        if not all(x is None or isinstance(x, str) for x in item):
            raise _bad(where, "an array of strings")
        return ["" if x is None else _go_text(x) for x in item]
    if kind == "time":
        if not isinstance(item, str):
            raise _bad(where, "an RFC 3339 time")
        try:
            return gojson.remarshal_time(item)
        except ValueError as exc:
            raise _bad(where, str(exc)) from None
    if not isinstance(item, bool):
        raise _bad(where, "a boolean")
    return item


def _encode_struct(spec: _Struct, value: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (kind, omitempty) in spec.items():
        item = value[name]
        if omitempty and (item is None or item == "" or item == []):
            continue
        if isinstance(kind, dict):
            item = _encode_struct(kind, item)
        elif isinstance(kind, tuple):
            item = None if item is None else _encode_struct(kind[1], item)
        out[name] = item
    return out


def _parse(data: bytes) -> Any:
    try:
        return json.loads(gojson.go_string(data), object_pairs_hook=_Object)
    except (ValueError, RecursionError):
        raise InvalidArtifact("model config is not valid JSON") from None


def decode(data: bytes) -> dict[str, Any]:
    """json.Unmarshal of a config blob into modelpack.Model (every field present, Go's zero values)."""
    return _decode_struct(_MODEL, None, _parse(data), "$")


def encode(model: Mapping[str, Any]) -> bytes:
    """json.Marshal of a modelpack.Model given as `decode` returns it."""
    return gojson.dumps(_encode_struct(_MODEL, model))


def is_modelpack_config(data: bytes) -> bool:
    """modelpack.IsModelPackConfig: `config.paramSize`, `descriptor.createdAt` or `modelfs` present
    (exact key names, as a Go map lookup)."""
    try:
        doc = json.loads(gojson.go_string(data))
    except (ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    config, descriptor = doc.get("config"), doc.get("descriptor")
    return (
        (isinstance(config, dict) and "paramSize" in config)
        or (isinstance(descriptor, dict) and "createdAt" in descriptor)
        or "modelfs" in doc
    )


def is_modelpack_model(manifest: Manifest, config_is_modelpack: bool) -> bool:
    """The one rule for "is this stored model a ModelPack model" (how its files are laid out, whether a
    Docker-format setting such as the context size can be written into its config): its manifest says so
    (the ModelPack config media type, which DMR's bundle goes by, or the ModelPack artifactType) or its
    config does (`config_is_modelpack`: `is_modelpack_config` of the blob, which DMR's config reader and
    mutate go by, as `ModelConfig.modelpack` keeps it)."""
    return (
        config_is_modelpack
        or manifest.config.media_type == mt.CONFIG_CNCF
        or manifest.artifact_type == mt.CNCF_MANIFEST_ARTIFACT_TYPE
    )


def _model(
    created: str | None, architecture: str, model_format: str, parameters: str, quantization: str
) -> dict[str, Any]:
    model: dict[str, Any] = _zero(_MODEL)
    model["descriptor"].update(createdAt=created, family=architecture)
    model["config"].update(
        architecture=architecture, format=model_format, paramSize=parameters, quantization=quantization
    )
    model["modelfs"]["type"] = "layers"
    return model


def from_docker_config(config: Mapping[str, Any], created: str, diff_ids: Sequence[str]) -> bytes:
    """DockerConfigToModelPack of the builder's Docker config (format, parameters, architecture,
    quantization; created already as Go marshals it) over the layers' diff IDs."""

    def text(key: str) -> str:
        value = config.get(key)
        return _go_text(value) if isinstance(value, str) else ""

    model = _model(created, text("architecture"), text("format"), text("parameters"), text("quantization"))
    model["modelfs"]["diffIds"] = list(diff_ids)
    return encode(model)


def from_docker_config_blob(data: bytes, diff_ids: Sequence[str]) -> bytes:
    """builder.convertToCNCF of a Docker-format model: its config blob read as types.ConfigFile, then
    DockerConfigToModelPack over the diff IDs of its layers."""
    docker = _decode_struct(_DOCKER_CONFIG_FILE, None, _parse(data), "$")
    inner = docker["config"]
    model = _model(
        docker["descriptor"]["created"],
        inner["architecture"],
        inner["format"],
        inner["parameters"],
        inner["quantization"],
    )
    model["modelfs"]["diffIds"] = list(diff_ids)
    return encode(model)


def reencode(data: bytes, diff_ids: Sequence[str] | None = None, more_diff_ids: Iterable[str] = ()) -> bytes:
    """A ModelPack config through Go's unmarshal and marshal: `diff_ids` replace modelfs.diffIds when
    given (convertToCNCF), `more_diff_ids` are appended (mutate.AppendLayers)."""
    model = decode(data)
    fs = model["modelfs"]
    ids = list(diff_ids) if diff_ids is not None else fs["diffIds"]
    more = list(more_diff_ids)
    if more:
        ids = [*(ids or []), *more]
    fs["diffIds"] = ids
    return encode(model)


def normalised_config(model: Mapping[str, Any]) -> dict[str, Any]:
    """The Docker-shaped `config` DMR's API serves for a ModelPack model (inference/models/adapter.go:
    normalizeConfig): the format lowercased, paramSize as the parameters and, as DMR's GetSize does, as
    the size too; no context size. Empty fields left out, as types.Config marshals."""
    config = model["config"]
    values = {
        "format": config["format"].lower(),
        "quantization": config["quantization"],
        "parameters": config["paramSize"],
        "architecture": config["architecture"],
        "size": config["paramSize"],
    }
    return {key: value for key, value in values.items() if value}


def infer_format(layers: Iterable[tuple[str, str | None]]) -> str:
    """The format of a ModelPack model whose config names none (partial.inferFormatFromAnnotations):
    that of the first weight-typed layer whose file path is a GGUF, safetensors or DDUF file.
    `layers`: (media type, file path) pairs in manifest order."""
    for media_type, filepath in layers:
        if media_type.startswith(WEIGHT_PREFIX) and filepath:
            found = weight_format(classify_file(filepath))
            if found:
                return found
    return ""
