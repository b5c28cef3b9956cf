"""The same files packaged by DMR and by modelrunner give the same config, manifest and model ID.

Expected bytes come from tests/conformance/dmr_layout.py (written from DMR's builder and types, and for
the GOLDEN_* values checked against Go's encoding/json), never from modelrunner's own encoder.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from modelrunner.artifact import builder, gojson
from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.builder import HashingSink, PackageSpec, build_artifact, extend_artifact
from modelrunner.artifact.manifest import parse_manifest
from modelrunner.artifact.model_config import make_config_blob, reencode_config
from modelrunner.store.sink import StoreSink
from modelrunner.store.store import ModelStore
from tests.conformance.dmr_layout import (
    ASSETS,
    DUMMY_GGUF,
    FIXED_EPOCH,
    GOLDEN_CONFIG,
    GOLDEN_ID,
    GOLDEN_MANIFEST,
    dummy_with_license,
    fixed_copy,
    sha256,
)


def _set_tz(value: str | None) -> None:
    if value is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = value
    time.tzset()


@pytest.fixture
def local_zone() -> Iterator[Any]:
    """Set the local time zone (Go's time.Local follows TZ like libc), restored afterwards."""
    before = os.environ.get("TZ")
    yield _set_tz
    _set_tz(before)


@pytest.fixture
def utc(local_zone: Any) -> None:
    local_zone("UTC")


@pytest.fixture
def source_date_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(FIXED_EPOCH))


def test_dummy_gguf_gives_dmrs_config_manifest_and_id(
    tmp_path: Path, utc: None, source_date_epoch: None
) -> None:
    # follows builder/builder.go (FromPath -> BaseModel), internal/partial (NewLayer, ManifestForLayers),
    # types/config.go; builder_test.go: TestWithCreatedDeterministicDigest's fixed time
    built = build_artifact(PackageSpec(gguf=fixed_copy(DUMMY_GGUF, tmp_path)), HashingSink())
    assert built.config_bytes == GOLDEN_CONFIG
    assert built.manifest_bytes == GOLDEN_MANIFEST
    assert sha256(built.manifest_bytes) == GOLDEN_ID


def test_the_id_is_the_same_through_the_store(tmp_path: Path, utc: None, source_date_epoch: None) -> None:
    store = ModelStore(tmp_path / "models")
    built = build_artifact(PackageSpec(gguf=fixed_copy(DUMMY_GGUF, tmp_path / "src")), StoreSink(store))
    assert store.add_model(built.manifest_bytes, ["dummy"]) == GOLDEN_ID
    assert store.read_manifest(GOLDEN_ID) == GOLDEN_MANIFEST
    assert store.read_blob(sha256(GOLDEN_CONFIG)) == GOLDEN_CONFIG


def test_license_layer_appended_as_dmr_package_does(tmp_path: Path, utc: None, monkeypatch: Any) -> None:
    # follows cmd/cli/commands/package.go (WithLicense after FromPath) and internal/mutate (diff IDs appended)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(int(datetime(2025, 1, 1, tzinfo=UTC).timestamp())))
    spec = PackageSpec(
        gguf=fixed_copy(DUMMY_GGUF, tmp_path), licenses=[fixed_copy(ASSETS / "license.txt", tmp_path)]
    )
    expected = dummy_with_license(None)
    built = build_artifact(spec, HashingSink())
    assert built.config_bytes == expected.config
    assert built.manifest_bytes == expected.manifest


def test_extra_layers_come_in_dmr_package_order(tmp_path: Path) -> None:
    # follows cmd/cli/commands/package.go: licenses, then the chat template, then the projector
    spec = PackageSpec(
        gguf=DUMMY_GGUF,
        licenses=[ASSETS / "license.txt"],
        mmproj=ASSETS / "dummy.mmproj",
        chat_template=ASSETS / "template.jinja",
    )
    layers = build_artifact(spec, HashingSink()).manifest.layers
    assert [layer.media_type for layer in layers] == [mt.GGUF, mt.LICENSE, mt.CHAT_TEMPLATE, mt.MMPROJ]


@pytest.mark.parametrize(
    ("zone", "mtime_ns", "expected"),
    [
        ("UTC", FIXED_EPOCH * 10**9 + 123_456_789, "2025-06-15T12:00:00.123456789Z"),
        ("UTC", FIXED_EPOCH * 10**9 + 500_000_000, "2025-06-15T12:00:00.5Z"),
        ("America/New_York", FIXED_EPOCH * 10**9, "2025-06-15T08:00:00-04:00"),
        ("Asia/Kolkata", FIXED_EPOCH * 10**9, "2025-06-15T17:30:00+05:30"),
    ],
)
def test_file_metadata_annotation_is_go_file_info(
    tmp_path: Path, local_zone: Any, zone: str, mtime_ns: int, expected: str
) -> None:
    # follows internal/partial/layer.go: types.FileMetadata{Name: base name, Mode: Perm(), Size,
    # ModTime: FileInfo.ModTime() (local zone, nanoseconds)} through json.Marshal (RFC 3339 nano)
    local_zone(zone)
    path = fixed_copy(DUMMY_GGUF, tmp_path)
    os.chmod(path, 0o4755)  # setuid is not a permission bit: Perm() drops it
    os.utime(path, ns=(mtime_ns, mtime_ns))
    [layer] = build_artifact(PackageSpec(gguf=path), HashingSink()).manifest.layers
    assert layer.annotations[mt.ANNOTATION_FILE_METADATA] == (
        f'{{"name":"dummy.gguf","mode":493,"uid":0,"gid":0,"size":2016,"mtime":"{expected}","typeflag":0}}'
    )
    # the daemon building for `model package` gets the CLI's TZ instead: the same times in that zone
    local_zone("Pacific/Chatham")
    given = builder.local_zone(zone)
    [layer] = build_artifact(PackageSpec(gguf=path), HashingSink(), file_time_zone=given).manifest.layers
    assert f'"mtime":"{expected}"' in layer.annotations[mt.ANNOTATION_FILE_METADATA]


def test_go_json_escapes_html_characters_and_keeps_unicode() -> None:
    # Go's encoding/json (used for every DMR config): <, >, & and U+2028/9 escaped, other text as UTF-8,
    # map keys sorted, struct fields in declaration order, empty omitempty fields left out.
    config = {
        "size": "1B",
        "format": "gguf",
        "quantization": "",
        "gguf": {"tokenizer.chat_template": "{% if a < b && c > d %}é\u2028{% endif %}", "a": "x"},
    }
    blob = make_config_blob(config, ["sha256:" + "0" * 64], datetime(2025, 1, 2, 3, 4, 5, 600, tzinfo=UTC))
    assert (
        blob
        == (
            '{"config":{"format":"gguf","size":"1B","gguf":{"a":"x","tokenizer.chat_template":'
            '"{% if a \\u003c b \\u0026\\u0026 c \\u003e d %}é\\u2028{% endif %}"}},'
            '"descriptor":{"created":"2025-01-02T03:04:05.0006Z"},'
            '"rootfs":{"type":"rootfs","diff_ids":["sha256:' + "0" * 64 + '"]}}'
        ).encode()
    )


def test_invalid_utf8_becomes_one_replacement_character_per_byte() -> None:
    # Go's json.Marshal replaces each invalid byte with U+FFFD (Python's "replace" may merge them)
    assert gojson.go_string(b"a\xe2\x82b\xff") == "a\ufffd\ufffdb\ufffd"


def test_context_size_repackage_reencodes_the_config_as_dmr_mutate_does() -> None:
    # follows internal/mutate/model.go: rawDockerConfigFile (json.Unmarshal into types.ConfigFile, set
    # ContextSize, json.Marshal): unknown fields dropped, created kept (fraction trimmed, +00:00 as Z)
    original = json.dumps(
        {
            "rootfs": {"diff_ids": ["sha256:" + "1" * 64], "type": "rootfs"},
            "descriptor": {"created": "2025-01-02T03:04:05.120000+00:00"},
            "config": {"size": "1B", "format": "gguf", "unknown": "dropped", "gguf": {"b": "2", "a": "1"}},
            "extra": True,
        }
    ).encode()
    assert (
        reencode_config(original, 8192, ["sha256:" + "2" * 64])
        == (
            '{"config":{"format":"gguf","size":"1B","gguf":{"a":"1","b":"2"},"context_size":8192},'
            '"descriptor":{"created":"2025-01-02T03:04:05.12Z"},'
            '"rootfs":{"type":"rootfs","diff_ids":["sha256:' + "1" * 64 + '","sha256:' + "2" * 64 + '"]}}'
        ).encode()
    )


def test_package_from_keeps_the_base_config_and_appends_layers(tmp_path: Path) -> None:
    # follows builder.FromModel + WithLicense (mutate.AppendLayers): the base's created time stays
    base_manifest = parse_manifest(GOLDEN_MANIFEST)
    built = extend_artifact(
        base_manifest,
        GOLDEN_CONFIG,
        PackageSpec(licenses=[ASSETS / "license.txt"], context_size=4096),
        HashingSink(),
    )
    doc = json.loads(built.config_bytes)
    assert doc["descriptor"] == {"created": "2025-06-15T12:00:00Z"}
    assert doc["config"]["context_size"] == 4096
    assert doc["rootfs"]["diff_ids"] == [layer.digest for layer in built.manifest.layers]
    assert built.manifest.layers[0] == base_manifest.layers[0]
    assert built.manifest_bytes.startswith(GOLDEN_MANIFEST[: GOLDEN_MANIFEST.index(b'"config"')])


def test_repackage_without_a_context_size_is_the_same_model(tmp_path: Path) -> None:
    # follows distribution/client.go: RepackageModel without ContextSize writes the stored model as it is
    from tests.conformance.dmr_layout import golden_dummy, write_dmr_store

    write_dmr_store(tmp_path / "models", [golden_dummy(["docker.io/ai/dummy:latest"])])
    store = ModelStore(tmp_path / "models")
    assert store.repackage("dummy", "dummy:copy", None) == GOLDEN_ID
    assert store.get("dummy:copy").id == GOLDEN_ID
    with_context = store.repackage("dummy", "dummy:8k", 8192)
    assert with_context != GOLDEN_ID
    manifest = store.read_manifest(with_context)
    assert manifest == GOLDEN_MANIFEST.replace(
        GOLDEN_MANIFEST[GOLDEN_MANIFEST.index(b'"config"') : GOLDEN_MANIFEST.index(b',"layers"')],
        b'"config":'
        + gojson.dumps(
            {
                "mediaType": mt.CONFIG_V01,
                "size": len(store.read_blob(parse_manifest(manifest).config.digest)),
                "digest": parse_manifest(manifest).config.digest,
            }
        ),
    )


def test_dduf_config_is_dmrs(tmp_path: Path, utc: None, source_date_epoch: None) -> None:
    # follows format/dduf.go: format, architecture "diffusers", go-units size, diffusers{layout, dduf_file}
    from tests.models import write_tiny_dduf

    path = write_tiny_dduf(tmp_path / "tiny.dduf")
    built = build_artifact(PackageSpec(dduf=path), HashingSink())
    size = path.stat().st_size
    units = f"{size / 1000:.2f}kB" if size >= 1000 else f"{size:.2f}B"
    if size >= 1_000_000:
        units = f"{size / 1_000_000:.2f}MB"
    assert (
        built.config_bytes
        == (
            '{"config":{"format":"dduf","architecture":"diffusers","size":"' + units + '",'
            '"diffusers":{"dduf_file":"tiny.dduf","layout":"dduf"}},'
            '"descriptor":{"created":"2025-06-15T12:00:00Z"},'
            '"rootfs":{"type":"rootfs","diff_ids":["' + sha256(path.read_bytes()) + '"]}}'
        ).encode()
    )
    assert built.manifest.config.media_type == mt.CONFIG_V01
