"""`model package`: turn local GGUF files, safetensors folders and DDUF files into a model artifact.

Everything is validated before any byte is copied, so bad input changes nothing. Each file is then read
exactly once: the sink hashes it while it copies it (into the store) or while it only hashes it (for a
tar streamed to a remote daemon).

The artifact is byte for byte what DMR's builder makes of the same files (`pkg/distribution/builder`,
`internal/partial`, `internal/mutate`, and `cmd/cli/commands/package.go` for the order of the extras), so
both give the same model ID: the layer annotations (`internal/partial/layer.go`: the file's base name,
permission bits, size and mtime in the local time zone, as Go marshals them), the config (model_config.py)
and the manifest (manifest.py). `created` is SOURCE_DATE_EPOCH when set (DMR's builder.WithCreated).

Those two, SOURCE_DATE_EPOCH and the local time zone, are all a build reads of its environment; the daemon
builds with its caller's (`model package` sends them) when told, so that the model ID does not depend on
how the daemon was started.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any, Protocol

from modelrunner.artifact import gojson, modelpack
from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.dduf import read_dduf
from modelrunner.artifact.filetypes import FileType, classify_file
from modelrunner.artifact.gguf import find_gguf_shards, read_gguf
from modelrunner.artifact.manifest import Descriptor, Manifest, check_relative_path
from modelrunner.artifact.model_config import make_config_blob, reencode_config
from modelrunner.artifact.safetensors import find_safetensors_shards, read_safetensors
from modelrunner.artifact.units import format_size
from modelrunner.errors import BadRequest, InvalidModelFile
from modelrunner.fileio import hash_file, require_regular_file

MAX_CHAT_TEMPLATE_BYTES = 1024 * 1024
MAX_CONTEXT_SIZE = 2**31 - 1
FORMAT_DOCKER = "docker"
FORMAT_CNCF = "cncf"
CNCF_CONTEXT_SIZE_ERROR = (
    "--context-size is not supported with --format cncf: the CNCF ModelPack specification does not define "
    "a context size field"
)


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
    # "docker" or "cncf" (CNCF ModelPack, modelpack.py); None: docker for new files, the base's for --from.
    format: str | None = None


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


def _file_time(mtime_ns: int, zone: tzinfo | None) -> str:
    """A file's ModTime as Go marshals it, in `zone` (None: this process's local zone)."""
    if zone is None:
        return gojson.local_rfc3339nano(mtime_ns)
    offset = datetime.fromtimestamp(mtime_ns // 1_000_000_000, zone).utcoffset()
    return gojson.rfc3339nano(mtime_ns, int(offset.total_seconds()) if offset else 0)


def _file_annotations(planned: _PlannedFile, zone: tzinfo | None) -> dict[str, str]:
    """partial.NewLayerWithRelativePath's annotations: types.FileMetadata as Go marshals it (the base
    name, permission bits, uid/gid 0, size, ModTime in the local zone) and the relative path."""
    st = os.stat(planned.path)
    mtime = _file_time(st.st_mtime_ns, zone)
    metadata = {
        "name": gojson.go_string(os.fsencode(planned.path.name)),
        "mode": stat.S_IMODE(st.st_mode) & 0o777,  # os.FileMode.Perm()
        "uid": 0,
        "gid": 0,
        "size": st.st_size,
        "mtime": mtime,
        "typeflag": 0,
    }
    return {
        mt.ANNOTATION_FILEPATH: gojson.go_string(os.fsencode(planned.filepath)),
        mt.ANNOTATION_FILE_METADATA: gojson.dumps(metadata).decode(),
        mt.ANNOTATION_MEDIATYPE_UNTESTED: "false",
    }


_WEIGHT_TYPES = (mt.SAFETENSORS, mt.GGUF, mt.DDUF)


_MEDIA_TYPE_OF_FILE = {
    FileType.GGUF: mt.GGUF,
    FileType.SAFETENSORS: mt.SAFETENSORS,
    FileType.DDUF: mt.DDUF,
    FileType.CHAT_TEMPLATE: mt.CHAT_TEMPLATE,
    FileType.LICENSE: mt.LICENSE,
}


def classify(name: str) -> str:
    """Media type of a file in a safetensors folder, by DMR's rules (`files/classify.go` and
    `builder/from_directory.go: fileTypeToMediaType`: config files are plain model files)."""
    return _MEDIA_TYPE_OF_FILE.get(classify_file(name), mt.MODEL_FILE)


def _walk_model_dir(root: Path) -> list[_PlannedFile]:
    """Every regular file under root in Go's filepath.Walk order (depth first, names sorted by their
    bytes, a folder's contents where its name sorts), skipping dot-files, dot-folders and symlinks as
    DMR's FromDirectory does."""
    if not root.exists():
        raise BadRequest(f"safetensors folder not found: {root.name}")
    if not root.is_dir():
        raise BadRequest(f"{root.name} is not a folder")
    planned: list[_PlannedFile] = []

    def walk(folder: Path) -> None:
        for name in sorted(os.listdir(folder), key=os.fsencode):
            path = folder / name
            if name.startswith("."):
                continue
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                walk(path)
            elif stat.S_ISREG(st.st_mode):  # not symlinks, FIFOs, sockets or devices
                relative = path.relative_to(root).as_posix()
                planned.append(_PlannedFile(path, classify(name), check_relative_path(relative), relative))

    walk(root)
    return planned


def _validate_context_size(value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not 0 < value <= MAX_CONTEXT_SIZE):
        raise BadRequest("context size must be a positive integer")


def _validate_format(spec: PackageSpec, output: str) -> None:
    if spec.format not in (None, FORMAT_DOCKER, FORMAT_CNCF):
        raise BadRequest(f'invalid format "{str(spec.format)[:40]}": must be "docker" or "cncf"')
    if output == FORMAT_CNCF and spec.context_size is not None:  # DMR's Builder.WithContextSize
        raise BadRequest(CNCF_CONTEXT_SIZE_ERROR)


def _as_cncf(files: Sequence[_PlannedFile], use_path: bool) -> list[_PlannedFile]:
    """The files re-typed as DMR's CNCF builder re-types them (modelpack.MapLayerMediaType: the file path
    is consulted for the model's own files, not for the extras appended after them)."""
    return [
        replace(f, media_type=modelpack.cncf_layer_media_type(f.media_type, f.filepath if use_path else None))
        for f in files
    ]


def _plan_extras(spec: PackageSpec) -> list[_PlannedFile]:
    """Licenses, chat template, multimodal projector: the order DMR's `package` appends them in."""
    extras: list[_PlannedFile] = []
    for license_path in spec.licenses:
        require_regular_file(license_path, "license file")
        extras.append(_PlannedFile(license_path, mt.LICENSE, license_path.name, "license file"))
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
    if spec.mmproj is not None:
        require_regular_file(spec.mmproj, "multimodal projector")
        extras.append(_PlannedFile(spec.mmproj, mt.MMPROJ, spec.mmproj.name, "multimodal projector"))
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


def _sibling_config_json(weights: list[_PlannedFile]) -> Path | None:
    """The first config.json in the folders of the weights, in walk order (openSiblingConfigJSON)."""
    for folder in dict.fromkeys(w.path.parent for w in weights):
        if os.path.lexists(folder / "config.json"):
            return folder / "config.json"
    return None


def _plan_safetensors(root: Path) -> tuple[list[_PlannedFile], dict[str, Any]]:
    planned = _walk_model_dir(root)
    weights = [p for p in planned if p.media_type in _WEIGHT_TYPES]
    safetensors = [p for p in weights if p.media_type == mt.SAFETENSORS]
    if not safetensors:
        raise InvalidModelFile(f"no .safetensors file in {root.name}")
    for weight in safetensors:  # each shard set must be complete
        find_safetensors_shards(weight.path)
    info = read_safetensors([w.path for w in safetensors], _sibling_config_json(weights))
    config: dict[str, Any] = {
        "format": mt.FORMAT_SAFETENSORS,
        "quantization": info.quantization,
        "parameters": info.parameters,
        "architecture": info.architecture,
        "size": format_size(sum(os.stat(w.path).st_size for w in weights)),  # every weight file
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


def created_time(environment: Mapping[str, str] = os.environ) -> datetime:
    """Now, or SOURCE_DATE_EPOCH (of this process, or of the environment given) for reproducible
    artifacts (the same inputs then give the same ID)."""
    epoch = environment.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.isdigit():
        return datetime.fromtimestamp(int(epoch), UTC)
    return datetime.now(UTC)


def local_zone(tz: str | None) -> tzinfo:
    """The local time zone of a process whose TZ is `tz` (None: unset), as Go's time.Local finds it (DMR's
    CLI builds in its own process): unset, the system's /etc/localtime; empty or "UTC", UTC; else a zone
    name of the system's database or the path of a zone file (a leading ':' dropped). What cannot be
    loaded is UTC, as for Go (libc would also read a POSIX rule such as `CET-1CEST`; Go does not)."""
    from zoneinfo import ZoneInfo

    name = "/etc/localtime" if tz is None else tz.removeprefix(":")
    if name in ("", "UTC"):
        return UTC
    try:
        if not name.startswith("/"):
            return ZoneInfo(name)
        if stat.S_ISREG(os.stat(name).st_mode):  # a FIFO or a device would never be a zone file
            with open(name, "rb") as file:
                return ZoneInfo.from_file(file)
    except (KeyError, ValueError, OSError):  # KeyError: ZoneInfoNotFoundError
        pass
    return UTC


def _assemble(
    files: Sequence[_PlannedFile],
    layers_before: Sequence[Descriptor],
    make_config: Callable[[list[str]], bytes],
    config_media_type: str,
    sink: BlobSink,
    file_time_zone: tzinfo | None = None,
    artifact_type: str | None = None,
) -> BuiltArtifact:
    """The layers (the base's, then one per file), the config made from the new layers' digests, the
    manifest."""
    names = [layer.filepath for layer in layers_before if layer.filepath] + [f.filepath for f in files]
    if len(names) != len(set(names)):
        raise BadRequest("two files of the model have the same name")
    layers = list(layers_before)
    new_digests: list[str] = []
    for planned in files:
        annotations = _file_annotations(planned, file_time_zone)
        digest, size = sink.add_file(planned.path, planned.what)
        layers.append(Descriptor(planned.media_type, digest, size, annotations))
        new_digests.append(digest)
    config_bytes = make_config(new_digests)
    config_digest = sink.add_bytes(config_bytes)
    manifest = Manifest(
        config=Descriptor(config_media_type, config_digest, len(config_bytes)),
        layers=tuple(layers),
        artifact_type=artifact_type,
    )
    return BuiltArtifact(manifest=manifest, manifest_bytes=manifest.to_bytes(), config_bytes=config_bytes)


def build_artifact(
    spec: PackageSpec,
    sink: BlobSink,
    created: datetime | None = None,
    file_time_zone: tzinfo | None = None,
) -> BuiltArtifact:
    """Build a new artifact from exactly one source (--gguf, --safetensors-dir or --dduf) plus extras.

    `created`: the config's creation time (None: created_time()). `file_time_zone`: the zone of the file
    times in the layer annotations (None: this process's local zone, as DMR's `package` writes them; UTC
    for artifacts whose ID must not depend on the machine, such as Hugging Face pulls).
    With `format="cncf"` the same files become a CNCF ModelPack artifact as DMR's builder makes it
    (modelpack.py): the layers re-typed, the ModelPack config, the manifest's artifactType."""
    sources = [s for s in (spec.gguf, spec.safetensors_dir, spec.dduf) if s is not None]
    if len(sources) != 1:
        raise BadRequest("exactly one of --gguf, --safetensors-dir, --dduf or --from is required")
    output = spec.format or FORMAT_DOCKER
    _validate_format(spec, output)
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
    extras = _plan_extras(spec)
    when = created or created_time()
    if output == FORMAT_CNCF:
        return _assemble(
            _as_cncf(files, True) + _as_cncf(extras, False),
            [],
            lambda digests: modelpack.from_docker_config(config, gojson.time_text(when), digests),
            mt.CONFIG_CNCF,
            sink,
            file_time_zone,
            mt.CNCF_MANIFEST_ARTIFACT_TYPE,
        )
    if spec.context_size is not None:
        config["context_size"] = spec.context_size
    return _assemble(
        files + extras,
        [],
        lambda digests: make_config_blob(config, digests, when),
        config_media_type,
        sink,
        file_time_zone,
    )


def extend_artifact(
    base: Manifest,
    base_config: bytes,
    spec: PackageSpec,
    sink: BlobSink,
    file_time_zone: tzinfo | None = None,
) -> BuiltArtifact:
    """`package --from MODEL`: the base model's layers reused as they are, plus new extras and settings.

    As DMR's builder.FromModel with mutate: the base config is kept (its `created` too) and re-encoded with
    the new layers' diff IDs appended. (`file_time_zone` is build_artifact's, for the new extras'
    layers.) The config media
    type stays the base's: DMR would write v0.1 here even for a v0.2 base, which breaks its layout.

    The output format is the base's unless `spec.format` names one. A Docker-format base asked for as
    "cncf" is converted as builder.convertToCNCF converts it: its layers re-typed (same blobs), its config
    turned into a ModelPack config over their diff IDs. A ModelPack base cannot become a Docker-format
    model (DMR would write a ModelPack config under a Docker media type)."""
    if any(s is not None for s in (spec.gguf, spec.safetensors_dir, spec.dduf)):
        raise BadRequest("--from cannot be combined with --gguf, --safetensors-dir or --dduf")
    base_is_cncf = modelpack.is_modelpack_config(base_config)
    output = spec.format or (FORMAT_CNCF if base_is_cncf else FORMAT_DOCKER)
    _validate_format(spec, output)
    _validate_context_size(spec.context_size)
    if output == FORMAT_CNCF:
        layers = tuple(
            replace(layer, media_type=modelpack.cncf_layer_media_type(layer.media_type, layer.filepath))
            for layer in base.layers
        )
        digests = [layer.digest for layer in base.layers]
        if base_is_cncf:
            converted = modelpack.reencode(base_config, digests)
        else:
            reencode_config(base_config)  # as DMR, a Docker config it cannot read fails the conversion
            converted = modelpack.from_docker_config_blob(base_config, digests)
        return _assemble(
            _as_cncf(_plan_extras(spec), False),
            layers,
            lambda digests: modelpack.reencode(converted, more_diff_ids=digests),
            mt.CONFIG_CNCF,
            sink,
            file_time_zone,
            artifact_type=mt.CNCF_MANIFEST_ARTIFACT_TYPE,
        )
    if modelpack.is_modelpack_model(base, base_is_cncf):
        raise BadRequest("a CNCF ModelPack model cannot be repackaged in the Docker format")
    reencode_config(base_config)  # a broken base config fails before anything is written
    return _assemble(
        _plan_extras(spec),
        base.layers,
        lambda digests: reencode_config(base_config, spec.context_size, digests),
        base.config.media_type,
        sink,
        file_time_zone,
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
