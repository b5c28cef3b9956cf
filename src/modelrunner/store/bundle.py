"""Runtime bundles: a folder per model whose files are hard links to the store's blobs.

Engines get plain file paths (`model/model.gguf`, annotated safetensors paths, `x.dduf`) without copies.
A bundle is built in a temporary folder and renamed into place, so a half-built one is never seen.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.manifest import Descriptor, Manifest, check_paths_distinct, check_relative_path
from modelrunner.errors import InvalidArtifact
from modelrunner.fileio import link_or_copy
from modelrunner.store.layout import StoreLayout

MODEL_DIR = "model"
CONFIG_FILE = "config.json"


def _numbered(stem: str, suffix: str, layers: list[Descriptor]) -> list[tuple[Descriptor, str]]:
    if not layers:
        return []
    if len(layers) == 1:
        return [(layers[0], f"{stem}.{suffix}")]
    total = len(layers)
    return [(layer, f"{stem}-{i:05d}-of-{total:05d}.{suffix}") for i, layer in enumerate(layers, 1)]


def bundle_file_names(manifest: Manifest) -> list[tuple[Descriptor, str]]:
    """Where each layer goes inside `model/`, following DMR's bundle layout (contract section 4).

    v0.2 artifacts are layer-per-file: each layer keeps its annotated relative path. Older ones place
    files by media type: model.gguf (or numbered shards), model.mmproj, template.jinja, model.safetensors.
    """
    if manifest.config.media_type == mt.CONFIG_V02:
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
    layout: StoreLayout, model_id: str, manifest: Manifest, runtime_config: dict[str, object]
) -> Path:
    """Return the model's bundle folder, building it first if it is missing."""
    final = layout.bundle_path(model_id)
    if (final / CONFIG_FILE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        for layer, name in bundle_file_names(manifest):
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
