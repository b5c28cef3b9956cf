"""`model package`: turn local GGUF files, safetensors folders and DDUF files into a model artifact.

Everything is validated before any byte is copied, so bad input changes nothing. Each file is then read
exactly once: the sink hashes it while it copies it (into the store) or while it only hashes it (for a
tar streamed to a remote daemon).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.dduf import read_dduf
from modelrunner.artifact.gguf import find_gguf_shards, read_gguf
from modelrunner.artifact.manifest import Descriptor, Manifest, check_relative_path
from modelrunner.artifact.model_config import make_config_blob, parse_config_blob, rfc3339
from modelrunner.artifact.safetensors import find_safetensors_shards, read_safetensors
from modelrunner.errors import BadRequest, InvalidModelFile
from modelrunner.fileio import hash_file, require_regular_file

MAX_CHAT_TEMPLATE_BYTES = 1024 * 1024
MAX_CONTEXT_SIZE = 2**31 - 1


class BlobSink(Protocol):
    """Where the builder puts file contents; returns (digest, size) after one read of the file."""

    def add_file(self, path: Path, what: str) -> tuple[str, int]: ...

    def add_bytes(self, data: bytes) -> str: ...


@dataclass
class PackageSpec:
    gguf: Path | None = None
    safetensors_dir: Path | None = None
    dduf: Path | None = None
    licenses: list[Path] = field(default_factory=list)
    mmproj: Path | None = None
    chat_template: Path | None = None
    context_size: int | None = None


@dataclass(frozen=True)
class BuiltArtifact:
    manifest: Manifest
    manifest_bytes: bytes
    config_bytes: bytes


@dataclass(frozen=True)
class _PlannedFile:
    path: Path
    media_type: str
    filepath: str  # relative path inside the artifact
    what: str


def _file_annotations(planned: _PlannedFile) -> dict[str, str]:
    st = os.stat(planned.path)
    metadata = {
        "name": planned.filepath,
        "mode": stat.S_IMODE(st.st_mode),
        "uid": 0,
        "gid": 0,
        "size": st.st_size,
        "mtime": rfc3339(datetime.fromtimestamp(st.st_mtime, UTC)),
        "typeflag": 0,
    }
    return {
        mt.ANNOTATION_FILEPATH: planned.filepath,
        mt.ANNOTATION_FILE_METADATA: json.dumps(metadata, separators=(",", ":")),
        mt.ANNOTATION_MEDIATYPE_UNTESTED: "false",
    }


def classify(name: str) -> str:
    """Media type of a file in a safetensors folder, by DMR's classifier rules."""
    lower = name.lower()
    if lower.endswith(".safetensors"):
        return mt.SAFETENSORS
    if lower.endswith(".gguf"):
        return mt.GGUF
    if lower.endswith(".dduf"):
        return mt.DDUF
    if lower.endswith(".jinja") or "chat_template" in lower:
        return mt.CHAT_TEMPLATE
    if any(word in lower for word in ("license", "licence", "copying", "notice")):
        return mt.LICENSE
    return mt.MODEL_FILE


def _walk_model_dir(root: Path) -> list[_PlannedFile]:
    """Every regular file under root, skipping dot-files, dot-folders and symlinks (as DMR does)."""
    if not root.exists():
        raise BadRequest(f"safetensors folder not found: {root.name}")
    if not root.is_dir():
        raise BadRequest(f"{root.name} is not a folder")
    planned: list[_PlannedFile] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(folder, d))
        )
        for name in sorted(files):
            path = Path(folder) / name
            if name.startswith(".") or path.is_symlink():
                continue
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                continue  # FIFOs, sockets, devices are never model files
            relative = path.relative_to(root).as_posix()
            planned.append(_PlannedFile(path, classify(name), check_relative_path(relative), relative))
    return planned


def _validate_context_size(value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not 0 < value <= MAX_CONTEXT_SIZE):
        raise BadRequest("context size must be a positive integer")


def _plan_extras(spec: PackageSpec) -> list[_PlannedFile]:
    extras: list[_PlannedFile] = []
    for license_path in spec.licenses:
        require_regular_file(license_path, "license file")
        extras.append(_PlannedFile(license_path, mt.LICENSE, license_path.name, "license file"))
    if spec.mmproj is not None:
        require_regular_file(spec.mmproj, "multimodal projector")
        extras.append(_PlannedFile(spec.mmproj, mt.MMPROJ, spec.mmproj.name, "multimodal projector"))
    if spec.chat_template is not None:
        st = require_regular_file(spec.chat_template, "chat template")
        if st.st_size > MAX_CHAT_TEMPLATE_BYTES:
            raise BadRequest("chat template is larger than 1 MiB")
        try:
            spec.chat_template.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("chat template is not UTF-8 text") from None
        extras.append(
            _PlannedFile(spec.chat_template, mt.CHAT_TEMPLATE, spec.chat_template.name, "chat template")
        )
    return extras


def _plan_gguf(path: Path) -> tuple[list[_PlannedFile], dict[str, Any]]:
    require_regular_file(path, "GGUF file")
    shards = find_gguf_shards(path)
    for shard in shards:
        require_regular_file(shard, "GGUF shard")
    info = read_gguf(shards)
    config: dict[str, Any] = {
        "format": mt.FORMAT_GGUF,
        "quantization": info.quantization,
        "parameters": info.parameters,
        "architecture": info.architecture,
        "size": info.size,
        "gguf": info.metadata,
    }
    if info.context_size:
        config["context_size"] = info.context_size
    return [_PlannedFile(s, mt.GGUF, s.name, "GGUF file") for s in shards], config


def _plan_safetensors(root: Path) -> tuple[list[_PlannedFile], dict[str, Any]]:
    planned = _walk_model_dir(root)
    weights = [p for p in planned if p.media_type == mt.SAFETENSORS]
    if not weights:
        raise InvalidModelFile(f"no .safetensors file in {root.name}")
    for weight in weights:  # each shard set must be complete
        find_safetensors_shards(weight.path)
    config_json = root / "config.json"
    info = read_safetensors([w.path for w in weights], config_json if config_json.is_file() else None)
    config: dict[str, Any] = {
        "format": mt.FORMAT_SAFETENSORS,
        "quantization": info.quantization,
        "parameters": info.parameters,
        "architecture": info.architecture,
        "size": info.size,
        "safetensors": info.metadata,
    }
    if info.context_size:
        config["context_size"] = info.context_size
    return planned, config


def _plan_dduf(path: Path) -> tuple[list[_PlannedFile], dict[str, Any]]:
    require_regular_file(path, "DDUF file")
    info = read_dduf(path)
    config: dict[str, Any] = {
        "format": mt.FORMAT_DDUF,
        "architecture": "diffusers",
        "size": info.size,
        "diffusers": {"layout": "dduf", "dduf_file": path.name},
    }
    return [_PlannedFile(path, mt.DDUF, path.name, "DDUF file")], config


def created_time() -> datetime:
    """Now, or SOURCE_DATE_EPOCH for reproducible artifacts (the same inputs then give the same ID)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.isdigit():
        return datetime.fromtimestamp(int(epoch), UTC)
    return datetime.now(UTC)


def _assemble(
    files: Sequence[_PlannedFile],
    layers_before: Sequence[Descriptor],
    config: dict[str, Any],
    config_media_type: str,
    sink: BlobSink,
    created: datetime,
) -> BuiltArtifact:
    names = [layer.filepath for layer in layers_before if layer.filepath] + [f.filepath for f in files]
    if len(names) != len(set(names)):
        raise BadRequest("two files of the model have the same name")
    layers = list(layers_before)
    for planned in files:
        annotations = _file_annotations(planned)
        digest, size = sink.add_file(planned.path, planned.what)
        layers.append(Descriptor(planned.media_type, digest, size, annotations))
    config_bytes = make_config_blob(config, [layer.digest for layer in layers], created)
    config_digest = sink.add_bytes(config_bytes)
    manifest = Manifest(
        config=Descriptor(config_media_type, config_digest, len(config_bytes)), layers=tuple(layers)
    )
    return BuiltArtifact(manifest=manifest, manifest_bytes=manifest.to_bytes(), config_bytes=config_bytes)


def build_artifact(spec: PackageSpec, sink: BlobSink, created: datetime | None = None) -> BuiltArtifact:
    """Build a new artifact from exactly one source (--gguf, --safetensors-dir or --dduf) plus extras."""
    sources = [s for s in (spec.gguf, spec.safetensors_dir, spec.dduf) if s is not None]
    if len(sources) != 1:
        raise BadRequest("exactly one of --gguf, --safetensors-dir, --dduf or --from is required")
    _validate_context_size(spec.context_size)
    if spec.gguf is not None:
        files, config = _plan_gguf(spec.gguf)
        config_media_type = mt.CONFIG_V01
    elif spec.safetensors_dir is not None:
        files, config = _plan_safetensors(spec.safetensors_dir)
        config_media_type = mt.CONFIG_V02
    else:
        assert spec.dduf is not None
        files, config = _plan_dduf(spec.dduf)
        config_media_type = mt.CONFIG_V01
    files += _plan_extras(spec)
    if spec.context_size is not None:
        config["context_size"] = spec.context_size
    return _assemble(files, [], config, config_media_type, sink, created or created_time())


def extend_artifact(
    base: Manifest, base_config: bytes, spec: PackageSpec, sink: BlobSink, created: datetime | None = None
) -> BuiltArtifact:
    """`package --from MODEL`: the base model's layers reused as they are, plus new extras and settings."""
    if any(s is not None for s in (spec.gguf, spec.safetensors_dir, spec.dduf)):
        raise BadRequest("--from cannot be combined with --gguf, --safetensors-dir or --dduf")
    if base.config.media_type == mt.CONFIG_CNCF:
        raise BadRequest("a CNCF-format model cannot be repackaged with --from")
    _validate_context_size(spec.context_size)
    config = dict(parse_config_blob(base_config, base.config.media_type).config)
    if spec.context_size is not None:
        config["context_size"] = spec.context_size
    return _assemble(
        _plan_extras(spec), base.layers, config, base.config.media_type, sink, created or created_time()
    )


class HashingSink:
    """BlobSink that only hashes: for a tar streamed to a daemon on another machine."""

    def __init__(self) -> None:
        self.files: dict[str, Path] = {}
        self.blobs: dict[str, bytes] = {}

    def add_file(self, path: Path, what: str) -> tuple[str, int]:
        digest, size = hash_file(path, what)
        self.files[digest] = path
        return digest, size

    def add_bytes(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return digest
