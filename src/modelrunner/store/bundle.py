"""Runtime bundles: a folder per model whose files are hard links to the store's blobs.

Engines get plain file paths (`model/model.gguf`, annotated safetensors paths, `x.dduf`) without copies.
A bundle is built in a temporary folder and renamed into place, so a half-built one is never seen.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.filetypes import FileType, classify_file
from modelrunner.artifact.manifest import Descriptor, Manifest, check_paths_distinct, check_relative_path
from modelrunner.artifact.modelpack import is_mmproj_path
from modelrunner.errors import InvalidArtifact
from modelrunner.fileio import link_or_copy
from modelrunner.store.layout import StoreLayout

MODEL_DIR = "model"
CONFIG_FILE = "config.json"
_SHARD = re.compile(r"(.+)-\d{5}-of-(\d{5})\.gguf")


def _numbered(stem: str, suffix: str, layers: list[Descriptor]) -> list[tuple[Descriptor, str]]:
    if not layers:
        return []
    if len(layers) == 1:
        return [(layers[0], f"{stem}.{suffix}")]
    total = len(layers)
    return [(layer, f"{stem}-{i:05d}-of-{total:05d}.{suffix}") for i, layer in enumerate(layers, 1)]


def _cncf_role(layer: Descriptor, model_format: str) -> str:
    """What a layer of a ModelPack model is to the engines, as DMR's bundle decides
    (unpack.go: updateBundleFieldsFromLayer, parse.go: the chat template is a `.jinja` file): "gguf",
    "safetensors", "dduf", "mmproj", "template", or "file" for anything else."""
    path = layer.filepath or ""
    if layer.media_type in (mt.GGUF, mt.CNCF_WEIGHT_GGUF):
        return "gguf"
    if layer.media_type in (mt.SAFETENSORS, mt.CNCF_WEIGHT_SAFETENSORS):
        return "safetensors"
    if layer.media_type == mt.DDUF:
        return "dduf"
    if layer.media_type == mt.MMPROJ:
        return "mmproj"
    if layer.media_type == mt.CHAT_TEMPLATE:
        return "template"
    if layer.media_type == mt.CNCF_WEIGHT_RAW:  # format-agnostic weights: the model's format says which
        if is_mmproj_path(path):
            return "mmproj"
        return {"gguf": "gguf", "safetensors": "safetensors", "dduf": "dduf"}.get(model_format, "file")
    if layer.media_type == mt.CNCF_WEIGHT_CONFIG_RAW and classify_file(path) is FileType.CHAT_TEMPLATE:
        return "template"
    return "file"


def _file_name(layer: Descriptor) -> str:
    return (layer.filepath or "").rsplit("/", 1)[-1]


def _first_shard_set(weights: list[Descriptor]) -> list[Descriptor]:
    """The first GGUF weight, with the other shards of its set when its name says it is one
    (`NAME-00001-of-00003.gguf`), in shard order."""
    first = _SHARD.fullmatch(_file_name(weights[0])) if weights else None
    if first is None:
        return weights[:1]
    shards = [w for w in weights if (m := _SHARD.fullmatch(_file_name(w))) and m.groups() == first.groups()]
    return sorted(shards, key=_file_name)


def _cncf_file_names(manifest: Manifest, model_format: str) -> list[tuple[Descriptor, str]]:
    """A ModelPack model's files. A GGUF model is laid out as v0.1 ones are, by role (llama.cpp finds
    model.gguf or its numbered shards, model.mmproj, template.jinja); only the shard set of the first
    weight counts as the model. Others keep their annotated paths, as DMR's UnpackFromLayers lays them
    out (vLLM and diffusers find their files there); a weight without a path gets its v0.1 name, and
    any other layer without one is left out, as DMR leaves it."""
    roles = [(layer, _cncf_role(layer, model_format)) for layer in manifest.layers]
    if model_format == mt.FORMAT_GGUF or (not model_format and any(role == "gguf" for _, role in roles)):
        weights = _first_shard_set([layer for layer, role in roles if role == "gguf"])
        placed = _numbered("model", "gguf", weights)
        placed += [(layer, "model.mmproj") for layer, role in roles if role == "mmproj"][:1]
        placed += [(layer, "template.jinja") for layer, role in roles if role == "template"][:1]
        return placed
    placed = []
    for role in ("safetensors", "dduf"):
        unnamed = [layer for layer, r in roles if r == role and not layer.filepath]
        placed += _numbered("model", role, unnamed)
    placed += [
        (layer, check_relative_path(layer.filepath, "layer")) for layer in manifest.layers if layer.filepath
    ]
    return placed


def bundle_file_names(
    manifest: Manifest, model_format: str = "", modelpack: bool = False
) -> list[tuple[Descriptor, str]]:
    """Where each layer goes inside `model/`, following DMR's bundle layout (contract section 4).

    v0.2 artifacts are layer-per-file: each layer keeps its annotated relative path. Older ones place
    files by media type: model.gguf (or numbered shards), model.mmproj, template.jinja, model.safetensors.
    ModelPack ones (`modelpack`: modelpack.is_modelpack_model) are placed by role (_cncf_file_names).
    """
    if modelpack:
        placed = _cncf_file_names(manifest, model_format)
    elif manifest.config.media_type == mt.CONFIG_V02:
        placed = []
        for layer in manifest.layers:
            if not layer.filepath:
                raise InvalidArtifact("a v0.2 model layer has no file path annotation")
            placed.append((layer, check_relative_path(layer.filepath, "layer")))
    else:
        by_type: dict[str, list[Descriptor]] = {}
        for layer in manifest.layers:
            by_type.setdefault(layer.media_type, []).append(layer)
        placed = _numbered("model", "gguf", by_type.get(mt.GGUF, []) + by_type.get(mt.CNCF_WEIGHT_GGUF, []))
        placed += _numbered(
            "model",
            "safetensors",
            by_type.get(mt.SAFETENSORS, []) + by_type.get(mt.CNCF_WEIGHT_SAFETENSORS, []),
        )
        placed += [(layer, "model.mmproj") for layer in by_type.get(mt.MMPROJ, [])[:1]]
        placed += [(layer, "template.jinja") for layer in by_type.get(mt.CHAT_TEMPLATE, [])[:1]]
        for layer in by_type.get(mt.DDUF, []):
            name = Path(layer.filepath).name if layer.filepath else "model.dduf"
            placed.append((layer, check_relative_path(name, "layer")))
    check_paths_distinct([name for _, name in placed])
    return placed


def build_bundle(
    layout: StoreLayout,
    model_id: str,
    manifest: Manifest,
    runtime_config: dict[str, object],
    model_format: str = "",
    modelpack: bool = False,
) -> Path:
    """Return the model's bundle folder, building it first if it is missing. `model_format`: the format
    the model's config names or its layers imply (ModelPack weights say only that they are weights);
    `modelpack`: whether it is a ModelPack model (modelpack.is_modelpack_model)."""
    final = layout.bundle_path(model_id)
    if (final / CONFIG_FILE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        for layer, name in bundle_file_names(manifest, model_format, modelpack):
            link_or_copy(layout.blob_path(layer.digest), staging / MODEL_DIR / name)
        (staging / CONFIG_FILE).write_text(json.dumps(runtime_config))
        if final.exists():  # a damaged bundle (no config.json): move it aside, then replace it
            shutil.rmtree(
                final.rename(final.with_name(f".{final.name}.damaged.{os.getpid()}")), ignore_errors=True
            )
        try:
            os.rename(staging, final)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            shutil.rmtree(staging)  # another process built it first: theirs is as good
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
        raise
    return final
