"""Stores and artifacts exactly as Docker Model Runner writes them, for the conformance tests.

Nothing here calls modelrunner: the bytes are written out from DMR's source by hand, so a test that opens
them checks modelrunner against DMR rather than against itself.

* `pkg/distribution/internal/store`: layout.json and models.json are Go's json.MarshalIndent (two spaces)
  of `Layout{Version: "1.0.0"}` and `Index{Models: []IndexEntry{ID, Tags, Files}}` (an entry without tags
  has `"tags": null`); blobs live at blobs/sha256/<hex>, raw manifests at manifests/sha256/<hex>; an
  entry's files are its layers then its config (manifests.go: newEntryForManifest). No lock file.
* `internal/store/index_test.go` (PR #536): tags are stored as `docker.io/ai/<name>:<tag>`;
  `distribution/normalize_test.go`: Hugging Face tags keep their case (`huggingface.co/org/model:Q4_K_M`).
* Artifacts: `builder.FromPath` + `internal/partial` marshalled by Go's encoding/json. GOLDEN_* below were
  produced by an oracle program that marshals DMR's types (types.ConfigFile, types.FileMetadata,
  oci.Manifest) with Go's encoding/json for upstream's assets/dummy.gguf, mode 0644, mtime and
  builder.WithCreated both 2025-06-15T12:00:00Z (the fixedTime of builder_test.go:
  TestWithCreatedDeterministicDigest), local time zone UTC.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
DUMMY_GGUF = ASSETS / "dummy.gguf"
FIXED_EPOCH = 1_749_988_800  # 2025-06-15T12:00:00Z
FIXED_NS = FIXED_EPOCH * 1_000_000_000

CONFIG_V01 = "application/vnd.docker.ai.model.config.v0.1+json"
GGUF = "application/vnd.docker.ai.gguf.v3"
LICENSE = "application/vnd.docker.ai.license"

DUMMY_DIGEST = "sha256:c7790a0a70161f1bfd441cf157313e9efb8fcd1f0831193101def035ead23b32"
DUMMY_GGUF_METADATA = (
    '{"some.parameter.arr.f32":"3.145000, 2.718000, 1.414000","some.parameter.arr.i16":"1, 2, 3, 4",'
    '"some.parameter.arr.str":"hello, world, !","some.parameter.bool":"true",'
    '"some.parameter.float32":"0.123457","some.parameter.float64":"0.123457",'
    '"some.parameter.int16":"-4661","some.parameter.int32":"-305419897",'
    '"some.parameter.int64":"-1311768467463790321","some.parameter.int8":"-19",'
    '"some.parameter.string":"hello world","some.parameter.uint16":"4660",'
    '"some.parameter.uint32":"305419896","some.parameter.uint64":"1311768467463790320",'
    '"some.parameter.uint8":"18"}'
)
GOLDEN_CONFIG = (
    '{"config":{"format":"gguf","quantization":"Unknown","parameters":"183","architecture":"llama",'
    '"size":"864B","gguf":' + DUMMY_GGUF_METADATA + "},"
    '"descriptor":{"created":"2025-06-15T12:00:00Z"},'
    '"rootfs":{"type":"rootfs","diff_ids":["' + DUMMY_DIGEST + '"]}}'
).encode()
GOLDEN_CONFIG_DIGEST = "sha256:3c20369982b5ddaddf5452fca173917494104744cd28d16228af5d509b71a6de"
GOLDEN_MANIFEST = (
    '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",'
    '"config":{"mediaType":"application/vnd.docker.ai.model.config.v0.1+json","size":838,'
    '"digest":"' + GOLDEN_CONFIG_DIGEST + '"},'
    '"layers":[{"mediaType":"application/vnd.docker.ai.gguf.v3","size":2016,"digest":"' + DUMMY_DIGEST + '",'
    '"annotations":{"org.cncf.model.file.mediatype.untested":"false",'
    '"org.cncf.model.file.metadata+json":"{\\"name\\":\\"dummy.gguf\\",\\"mode\\":420,\\"uid\\":0,'
    '\\"gid\\":0,\\"size\\":2016,\\"mtime\\":\\"2025-06-15T12:00:00Z\\",\\"typeflag\\":0}",'
    '"org.cncf.model.filepath":"dummy.gguf"}}]}'
).encode()
GOLDEN_ID = "sha256:8a06f1945df854a8498701912a711e2f39cd2bee0293fdfd2774ce458851171a"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fixed_copy(source: Path, folder: Path) -> Path:
    """`source` copied into `folder` with mode 0644 and the fixed mtime (what the golden bytes assume)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.name
    shutil.copyfile(source, target)
    os.chmod(target, 0o644)
    os.utime(target, ns=(FIXED_NS, FIXED_NS))
    return target


def layer_json(media_type: str, data: bytes, name: str, mtime: str = "2025-06-15T12:00:00Z") -> str:
    """One oci.Descriptor as partial.NewLayer writes it (annotation keys sorted, as Go sorts map keys)."""
    metadata = (
        f'{{\\"name\\":\\"{name}\\",\\"mode\\":420,\\"uid\\":0,\\"gid\\":0,\\"size\\":{len(data)},'
        f'\\"mtime\\":\\"{mtime}\\",\\"typeflag\\":0}}'
    )
    return (
        f'{{"mediaType":"{media_type}","size":{len(data)},"digest":"{sha256(data)}",'
        f'"annotations":{{"org.cncf.model.file.mediatype.untested":"false",'
        f'"org.cncf.model.file.metadata+json":"{metadata}","org.cncf.model.filepath":"{name}"}}}}'
    )


def manifest_json(config: bytes, layers: list[str], config_type: str = CONFIG_V01) -> bytes:
    """oci.Manifest as json.Marshal writes it."""
    return (
        '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",'
        f'"config":{{"mediaType":"{config_type}","size":{len(config)},"digest":"{sha256(config)}"}},'
        f'"layers":[{",".join(layers)}]}}'
    ).encode()


@dataclass(frozen=True)
class DMRModel:
    manifest: bytes
    config: bytes
    blobs: dict[str, bytes]  # layer digests, in manifest order, to their bytes
    tags: list[str] | None  # None: DMR's `"tags": null`

    @property
    def id(self) -> str:
        return sha256(self.manifest)

    @property
    def files(self) -> list[str]:
        return [*self.blobs, sha256(self.config)]


def golden_dummy(tags: list[str] | None) -> DMRModel:
    data = DUMMY_GGUF.read_bytes()
    return DMRModel(GOLDEN_MANIFEST, GOLDEN_CONFIG, {DUMMY_DIGEST: data}, tags)


def dummy_with_license(tags: list[str] | None, created: str = "2025-01-01T00:00:00Z") -> DMRModel:
    """dummy.gguf plus upstream's license.txt (builder.WithLicense); both files' mtime is the fixed one."""
    gguf, license_text = DUMMY_GGUF.read_bytes(), (ASSETS / "license.txt").read_bytes()
    config = (
        '{"config":{"format":"gguf","quantization":"Unknown","parameters":"183","architecture":"llama",'
        '"size":"864B","gguf":' + DUMMY_GGUF_METADATA + "},"
        f'"descriptor":{{"created":"{created}"}},'
        f'"rootfs":{{"type":"rootfs","diff_ids":["{sha256(gguf)}","{sha256(license_text)}"]}}}}'
    ).encode()
    layers = [layer_json(GGUF, gguf, "dummy.gguf"), layer_json(LICENSE, license_text, "license.txt")]
    blobs = {sha256(gguf): gguf, sha256(license_text): license_text}
    return DMRModel(manifest_json(config, layers), config, blobs, tags)


def write_dmr_store(root: Path, models: list[DMRModel]) -> None:
    """A store laid out as DMR's LocalStore writes it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "layout.json").write_bytes(json.dumps({"version": "1.0.0"}, indent=2).encode())
    for model in models:
        for digest, data in [*model.blobs.items(), (sha256(model.config), model.config)]:
            path = root / "blobs" / "sha256" / digest.removeprefix("sha256:")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        manifest = root / "manifests" / "sha256" / model.id.removeprefix("sha256:")
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_bytes(model.manifest)
    index = {"models": [{"id": m.id, "tags": m.tags, "files": m.files} for m in models]}
    (root / "models.json").write_bytes(json.dumps(index, indent=2).encode())
