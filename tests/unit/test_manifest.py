"""Manifests (artifact/manifest.py) and config blobs (artifact/model_config.py), against contract 3.1-3.2."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.manifest import (
    MAX_BLOB_SIZE,
    MAX_LAYERS,
    MAX_MANIFEST_BYTES,
    Descriptor,
    Manifest,
    parse_manifest,
    sha256_digest,
)
from modelrunner.artifact.model_config import (
    ModelConfig,
    make_config_blob,
    parse_config_blob,
    with_context_size,
)
from modelrunner.errors import InvalidArtifact, UnsupportedMediaType

FIXED_TIME = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)

D1 = sha256_digest(b"layer one")
D2 = sha256_digest(b"layer two")
DC = sha256_digest(b"config")


def manifest_doc(**changes: Any) -> dict[str, Any]:
    """A valid manifest document (two annotated GGUF layers); `changes` replace top-level keys."""
    doc: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "config": {"mediaType": mt.CONFIG_V01, "digest": DC, "size": 6},
        "layers": [
            {
                "mediaType": mt.GGUF,
                "digest": D1,
                "size": 9,
                "annotations": {mt.ANNOTATION_FILEPATH: "model-00001-of-00002.gguf"},
            },
            {
                "mediaType": mt.GGUF,
                "digest": D2,
                "size": 9,
                "annotations": {mt.ANNOTATION_FILEPATH: "model-00002-of-00002.gguf"},
            },
        ],
    }
    doc.update(changes)
    return doc


def with_layer(**changes: Any) -> dict[str, Any]:
    """A valid manifest whose first layer has `changes` applied (None removes a key)."""
    doc = manifest_doc()
    layer = doc["layers"][0]
    for key, value in changes.items():
        if value is None:
            layer.pop(key, None)
        else:
            layer[key] = value
    return doc


def with_filepath(path: str) -> dict[str, Any]:
    return with_layer(annotations={mt.ANNOTATION_FILEPATH: path})


def encode(doc: Any) -> bytes:
    return json.dumps(doc).encode()


# --- manifests ---------------------------------------------------------------------------------------------


def test_manifest_round_trips_through_to_bytes_and_parse() -> None:
    manifest = Manifest(
        config=Descriptor(mt.CONFIG_V02, DC, 6),
        layers=(
            Descriptor(mt.SAFETENSORS, D1, 9, {mt.ANNOTATION_FILEPATH: "model.safetensors"}),
            Descriptor(mt.MODEL_FILE, D2, 9, {mt.ANNOTATION_FILEPATH: "sub/config.json", "x": "y"}),
        ),
        artifact_type=mt.CNCF_MANIFEST_ARTIFACT_TYPE,
    )
    data = manifest.to_bytes()
    parsed = parse_manifest(data)
    assert parsed == manifest
    assert parsed.to_bytes() == data
    assert parsed.blobs == [*manifest.layers, manifest.config]
    assert parsed.layers[1].filepath == "sub/config.json"


def test_manifest_bytes_are_oci_schema_2() -> None:
    doc = json.loads(Manifest(Descriptor(mt.CONFIG_V01, DC, 6), (Descriptor(mt.GGUF, D1, 9),)).to_bytes())
    assert doc["schemaVersion"] == 2
    assert doc["mediaType"] == mt.OCI_MANIFEST
    assert doc["layers"] == [{"mediaType": mt.GGUF, "digest": D1, "size": 9}]
    assert "artifactType" not in doc


def test_parse_accepts_docker_v2_manifest_and_missing_media_type() -> None:
    assert parse_manifest(encode(manifest_doc(mediaType=mt.DOCKER_MANIFEST_V2))).media_type == (
        mt.DOCKER_MANIFEST_V2
    )
    doc = manifest_doc()
    del doc["mediaType"]
    assert parse_manifest(encode(doc)).media_type == mt.OCI_MANIFEST


@pytest.mark.parametrize("config_type", sorted(mt.SUPPORTED_CONFIG_TYPES))
def test_parse_accepts_every_supported_config_type(config_type: str) -> None:
    doc = manifest_doc(config={"mediaType": config_type, "digest": DC, "size": 6})
    assert parse_manifest(encode(doc)).config.media_type == config_type


def test_layer_size_of_exactly_4_tib_is_accepted() -> None:
    assert parse_manifest(encode(with_layer(size=MAX_BLOB_SIZE))).layers[0].size == 1 << 42


def many_layers(n: int) -> dict[str, Any]:
    layer = {"mediaType": mt.LICENSE, "digest": D1, "size": 1}
    return manifest_doc(layers=[layer] * n)


def test_max_layers_is_accepted() -> None:
    assert len(parse_manifest(encode(many_layers(MAX_LAYERS))).layers) == MAX_LAYERS


BAD_MANIFESTS: list[tuple[str, bytes]] = [
    ("not JSON", b"{not json"),
    ("not UTF-8", b'{"schemaVersion": 2, "x": "\xff"}'),
    ("empty", b""),
    ("a list", encode([manifest_doc()])),
    ("a string", encode("manifest")),
    ("null", b"null"),
    ("no schemaVersion", encode({k: v for k, v in manifest_doc().items() if k != "schemaVersion"})),
    ("schemaVersion 1", encode(manifest_doc(schemaVersion=1))),
    ("schemaVersion '2'", encode(manifest_doc(schemaVersion="2"))),
    ("image index media type", encode(manifest_doc(mediaType="application/vnd.oci.image.index.v1+json"))),
    ("unknown manifest media type", encode(manifest_doc(mediaType="text/plain"))),
    ("no config", encode({k: v for k, v in manifest_doc().items() if k != "config"})),
    ("config not an object", encode(manifest_doc(config="sha256:x"))),
    ("config without digest", encode(manifest_doc(config={"mediaType": mt.CONFIG_V01, "size": 6}))),
    ("config without media type", encode(manifest_doc(config={"digest": DC, "size": 6}))),
    ("no layers key", encode({k: v for k, v in manifest_doc().items() if k != "layers"})),
    ("empty layers", encode(manifest_doc(layers=[]))),
    ("layers not a list", encode(manifest_doc(layers={"0": manifest_doc()["layers"][0]}))),
    ("layer not an object", encode(manifest_doc(layers=["sha256:x"]))),
    ("layer size negative", encode(with_layer(size=-1))),
    ("layer size bool", encode(with_layer(size=True))),
    ("layer size over 4 TiB", encode(with_layer(size=MAX_BLOB_SIZE + 1))),
    ("layer size string", encode(with_layer(size="9"))),
    ("layer size float", encode(with_layer(size=9.0))),
    ("layer size missing", encode(with_layer(size=None))),
    ("digest path traversal", encode(with_layer(digest="sha256:../../etc/passwd"))),
    ("digest uppercase hex", encode(with_layer(digest=D1.upper().replace("SHA256", "sha256")))),
    ("digest too short", encode(with_layer(digest=D1[:-1]))),
    ("digest too long", encode(with_layer(digest=D1 + "0"))),
    ("digest sha512", encode(with_layer(digest="sha512:" + "0" * 128))),
    ("digest without algorithm", encode(with_layer(digest=D1.removeprefix("sha256:")))),
    ("digest not a string", encode(with_layer(digest=12))),
    ("digest with newline", encode(with_layer(digest=D1 + "\n"))),
    ("empty layer media type", encode(with_layer(mediaType=""))),
    ("annotations not an object", encode(with_layer(annotations=["a"]))),
    ("annotation value not a string", encode(with_layer(annotations={mt.ANNOTATION_FILEPATH: 1}))),
    ("filepath ../x", encode(with_filepath("../x"))),
    ("filepath a/../../x", encode(with_filepath("a/../../x"))),
    ("filepath /abs", encode(with_filepath("/etc/passwd"))),
    ("filepath backslash", encode(with_filepath("a\\b"))),
    ("filepath empty", encode(with_filepath(""))),
    ("filepath NUL", encode(with_filepath("a\x00b"))),
    ("filepath newline", encode(with_filepath("a\nb"))),
    ("filepath .", encode(with_filepath("."))),
    ("filepath a//b", encode(with_filepath("a//b"))),
    ("filepath trailing slash", encode(with_filepath("a/"))),
    ("filepath too long", encode(with_filepath("a" * 1025))),
    (
        "duplicate file paths",
        encode(
            manifest_doc(
                layers=[
                    {
                        "mediaType": mt.GGUF,
                        "digest": D,
                        "size": 9,
                        "annotations": {mt.ANNOTATION_FILEPATH: "m"},
                    }
                    for D in (D1, D2)
                ]
            )
        ),
    ),
    ("too many layers", encode(many_layers(MAX_LAYERS + 1))),
    ("too large", b" " * MAX_MANIFEST_BYTES + encode(manifest_doc())),
]


@pytest.mark.parametrize(("case", "data"), BAD_MANIFESTS, ids=[case for case, _ in BAD_MANIFESTS])
def test_parse_manifest_refuses_invalid_manifest(refuses: Any, case: str, data: bytes) -> None:
    with refuses(InvalidArtifact) as info:
        parse_manifest(data)
    assert info.value.status_code == 400


@pytest.mark.parametrize(
    "media_type",
    [
        pytest.param(["application/vnd.oci.image.manifest.v1+json"], id="list"),
        pytest.param({"a": 1}, id="object"),
    ],
)
def test_parse_manifest_refuses_non_string_manifest_media_type(refuses: Any, media_type: Any) -> None:
    with refuses(InvalidArtifact):
        parse_manifest(encode(manifest_doc(mediaType=media_type)))


@pytest.mark.parametrize(
    "config_type",
    [
        "application/vnd.docker.ai.model.config.v0.3+json",
        "application/vnd.oci.image.config.v1+json",
        "application/vnd.cncf.model.config.v2+json",
    ],
)
def test_unknown_config_media_type_is_unsupported_and_hints_at_upgrading(
    refuses: Any, config_type: str
) -> None:
    doc = manifest_doc(config={"mediaType": config_type, "digest": DC, "size": 6})
    with refuses(UnsupportedMediaType) as info:
        parse_manifest(encode(doc))
    assert info.value.status_code == 422
    assert "upgrad" in info.value.message
    assert config_type in info.value.message


def test_error_messages_cut_hostile_input_short() -> None:
    with pytest.raises(InvalidArtifact) as info:
        parse_manifest(encode(with_layer(digest="x" * 100_000)))
    assert len(info.value.message) < 300


# --- config blobs ------------------------------------------------------------------------------------------


def docker_config(**inner: Any) -> bytes:
    model = {"format": "gguf", "quantization": "F32", "architecture": "llama", "size": "1MB"} | inner
    return make_config_blob(model, [D1, D2], FIXED_TIME)


def test_make_config_blob_has_the_contract_shape() -> None:
    doc = json.loads(docker_config(context_size=512))
    assert doc["config"]["format"] == "gguf"
    assert doc["config"]["context_size"] == 512
    assert doc["descriptor"] == {"created": "2025-01-02T03:04:05Z"}
    assert doc["rootfs"] == {"type": "rootfs", "diff_ids": [D1, D2]}


@pytest.mark.parametrize("config_type", [mt.CONFIG_V01, mt.CONFIG_V02])
def test_parse_docker_config(config_type: str) -> None:
    parsed = parse_config_blob(docker_config(context_size=512), config_type)
    assert parsed.format == "gguf"
    assert parsed.context_size == 512
    assert parsed.config["architecture"] == "llama"
    assert parsed.created == int(FIXED_TIME.timestamp())


def test_legacy_diffusers_format_reads_as_dduf() -> None:
    parsed = parse_config_blob(docker_config(format="diffusers"), mt.CONFIG_V01)
    assert parsed.format == "dduf"
    assert parsed.config["format"] == "dduf"


@pytest.mark.parametrize(
    ("descriptor", "created"),
    [({}, 0), ({"created": "yesterday"}, 0), ({"created": 5}, 0), ("x", 0), ({"created": ""}, 0)],
)
def test_config_with_unusable_created_time_reads_as_zero(descriptor: Any, created: int) -> None:
    data = json.dumps({"config": {"format": "gguf"}, "descriptor": descriptor}).encode()
    assert parse_config_blob(data, mt.CONFIG_V01).created == created


@pytest.mark.parametrize("value", [True, "512", 1.5, None])
def test_context_size_property_ignores_non_integers(value: Any) -> None:
    assert ModelConfig(config={"context_size": value}, created=0).context_size is None


def test_cncf_config_is_mapped_to_the_docker_shape() -> None:
    # as DMR's normalizeConfig (pkg/inference/models/adapter.go): config.architecture, not the family;
    # GetSize is the paramSize
    cncf = {
        "descriptor": {"createdAt": "2025-01-02T03:04:05Z", "family": "qwen3", "name": "x"},
        "config": {
            "architecture": "transformer",
            "format": "gguf",
            "paramSize": "8B",
            "quantization": "Q4_K_M",
        },
        "modelfs": {"type": "layers", "diffIds": [D1]},
    }
    parsed = parse_config_blob(encode(cncf), mt.CONFIG_CNCF)
    assert parsed.config == {
        "format": "gguf",
        "quantization": "Q4_K_M",
        "parameters": "8B",
        "architecture": "transformer",
        "size": "8B",
    }
    assert parsed.created == int(FIXED_TIME.timestamp())
    assert parsed.context_size is None  # CNCF configs have no context size field


def test_cncf_config_without_family_uses_architecture() -> None:
    cncf = {"config": {"architecture": "llama", "format": "safetensors"}}
    parsed = parse_config_blob(encode(cncf), mt.CONFIG_CNCF)
    assert parsed.config["architecture"] == "llama"
    assert parsed.created == 0


def test_with_context_size_replaces_only_the_context_size() -> None:
    original = docker_config(context_size=512, gguf={"general.name": "tiny"})
    updated = with_context_size(original, 8192)
    before, after = json.loads(original), json.loads(updated)
    assert after["config"]["context_size"] == 8192
    expected = copy.deepcopy(before)
    expected["config"]["context_size"] = 8192
    assert after == expected


def test_with_context_size_adds_a_missing_context_size() -> None:
    updated = with_context_size(docker_config(), 4096)
    assert parse_config_blob(updated, mt.CONFIG_V01).context_size == 4096


BAD_CONFIGS = [
    ("not JSON", b"{"),
    ("not UTF-8", b'{"config": "\xff"}'),
    ("a list", b"[]"),
    ("no config object", b'{"descriptor": {}}'),
    ("config not an object", b'{"config": "gguf"}'),
    ("too large", b" " * (16 * 1024 * 1024) + b"{}"),
]


@pytest.mark.parametrize(("case", "data"), BAD_CONFIGS, ids=[case for case, _ in BAD_CONFIGS])
def test_parse_config_blob_refuses_invalid_config(refuses: Any, case: str, data: bytes) -> None:
    with refuses(InvalidArtifact):
        parse_config_blob(data, mt.CONFIG_V01)


@pytest.mark.parametrize(("case", "data"), BAD_CONFIGS, ids=[case for case, _ in BAD_CONFIGS])
def test_with_context_size_refuses_invalid_config(refuses: Any, case: str, data: bytes) -> None:
    with refuses(InvalidArtifact):
        with_context_size(data, 512)


@pytest.mark.parametrize("data", [b"[]", b"{", b" " * (16 * 1024 * 1024) + b"{}"])
def test_parse_cncf_config_refuses_invalid_json(refuses: Any, data: bytes) -> None:
    with refuses(InvalidArtifact):
        parse_config_blob(data, mt.CONFIG_CNCF)
