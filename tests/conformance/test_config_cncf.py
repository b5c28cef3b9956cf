"""`model package --format cncf`: the same files packaged by DMR and by modelrunner give the same CNCF
ModelPack config, manifest and model ID.

The GOLDEN_* IDs below were produced by an oracle program that runs DMR's CNCF builder logic
(builder.fromFormatCNCF, FromDirectory's CNCF branch, convertToCNCF, mutate.rawCNCFConfigFile,
modelpack.MapLayerMediaType and DockerConfigToModelPack, partial.ManifestForLayers) over model-spec
v0.0.7's `specs-go/v1.Model` and DMR's oci types with Go's encoding/json, for upstream's assets with mode
0644, mtime and builder.WithCreated 2025-06-15T12:00:00Z (builder_test.go: TestFromPathCNCFFormat's
fixedTime), local time zone UTC. The expected bytes are written out here by hand from those sources and
must hash to the oracle's IDs, so they are checked against Go and never against modelrunner's encoder.
(None of these strings holds a \\b or \\f, whose escaping changed in Go 1.22.)
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact import modelpack
from modelrunner.artifact.builder import HashingSink, PackageSpec, build_artifact, extend_artifact
from modelrunner.artifact.manifest import parse_manifest
from modelrunner.artifact.model_config import parse_config_blob
from modelrunner.errors import BadRequest, InvalidArtifact
from modelrunner.store.sink import StoreSink
from modelrunner.store.store import ModelStore
from tests.conformance.dmr_layout import (
    ASSETS,
    DUMMY_DIGEST,
    DUMMY_GGUF,
    FIXED_EPOCH,
    FIXED_NS,
    GOLDEN_CONFIG,
    GOLDEN_MANIFEST,
    fixed_copy,
    layer_json,
    sha256,
)

RAW = "application/vnd.cncf.model.weight.v1.raw"
CONFIG_RAW = "application/vnd.cncf.model.weight.config.v1.raw"
DOC_RAW = "application/vnd.cncf.model.doc.v1.raw"

# modelpack.DockerConfigToModelPack of dummy.gguf's config (gguf_model_test.go's values).
GOLDEN_CNCF_CONFIG = (
    '{"descriptor":{"createdAt":"2025-06-15T12:00:00Z","family":"llama"},'
    '"modelfs":{"type":"layers","diffIds":["' + DUMMY_DIGEST + '"]},'
    '"config":{"architecture":"llama","format":"gguf","paramSize":"183","quantization":"Unknown"}}'
).encode()
GOLDEN_CNCF_CONFIG_DIGEST = "sha256:9b361c56094622645a8ec4a1575578ce90c3aa6ab9de90515b2c444f2e7a33dc"
GOLDEN_CNCF_ID = "sha256:ec88bea25bf464e17605a54477c7d9b6d38f221df4fe059f1d965a20d03f3aac"
# what the API serves for it, tagged dummy-cncf and built at FIXED_EPOCH (DMR's inference/models/adapter.go:
# normalizeConfig: a ModelPack model's size is its parameter size)
GOLDEN_CNCF_API = {
    "id": GOLDEN_CNCF_ID,
    "tags": ["docker.io/ai/dummy-cncf:latest"],
    "created": FIXED_EPOCH,
    "config": {
        "format": "gguf",
        "quantization": "Unknown",
        "parameters": "183",
        "architecture": "llama",
        "size": "183",
    },
}
# + WithLicense(license.txt), WithChatTemplateFile(template.jinja), WithMultimodalProjector(dummy.mmproj)
GOLDEN_CNCF_EXTRAS_ID = "sha256:214d0d51d824f930bb7feecbac5fe1651aee0def215f7e99fbdc16feaa8a100e"
# FromModel(the Docker-format dummy of dmr_layout, WithFormat(cncf)) + WithLicense(license.txt)
GOLDEN_CNCF_CONVERTED_ID = "sha256:279102a288a3a2488561fd4c0ff62d6b2b5cdf54078bcb750098d624e618a05f"
# FromDirectory(safetensors_folder(), WithOutputFormat(cncf)), created at the fixed time
GOLDEN_CNCF_FOLDER_ID = "sha256:436913a1a18402a67a8965472c8533d0262e02c25747f4f78ac64fd8f631e80b"


def cncf_manifest(config: bytes, layers: list[str]) -> bytes:
    """oci.Manifest as partial.ManifestForLayers fills it for a CNCFModel (GetManifestOptions)."""
    return (
        '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",'
        '"artifactType":"application/vnd.cncf.model.manifest.v1+json",'
        f'"config":{{"mediaType":"application/vnd.cncf.model.config.v1+json","size":{len(config)},'
        f'"digest":"{sha256(config)}"}},"layers":[{",".join(layers)}]}}'
    ).encode()


def cncf_config(family: str, diff_ids: list[str], config: str) -> bytes:
    return (
        f'{{"descriptor":{{"createdAt":"2025-06-15T12:00:00Z","family":"{family}"}},'
        f'"modelfs":{{"type":"layers","diffIds":{json.dumps(diff_ids, separators=(",", ":"))}}},'
        f'"config":{config}}}'
    ).encode()


DUMMY_CONFIG_FIELDS = '{"architecture":"llama","format":"gguf","paramSize":"183","quantization":"Unknown"}'


@pytest.fixture
def utc() -> Iterator[None]:
    """Go's time.Local (file times in the layer annotations) follows TZ like libc."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.fixture(autouse=True)
def source_date_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(FIXED_EPOCH))


def assets(tmp_path: Path, *names: str) -> list[Path]:
    return [fixed_copy(ASSETS / name, tmp_path) for name in names]


def test_dummy_gguf_gives_dmrs_cncf_config_manifest_and_id(tmp_path: Path, utc: None) -> None:
    # follows builder/builder.go (fromFormatCNCF), modelpack/convert.go (MapLayerMediaType: a GGUF layer is
    # weight.v1.raw; DockerConfigToModelPack), internal/partial/cncf_model.go (config media type,
    # artifactType); builder_test.go: TestFromPathCNCFFormat, TestFromPathCNCFDeterministicDigest
    [gguf] = assets(tmp_path, "dummy.gguf")
    built = build_artifact(PackageSpec(gguf=gguf, format="cncf"), HashingSink())
    expected_manifest = cncf_manifest(
        GOLDEN_CNCF_CONFIG, [layer_json(RAW, DUMMY_GGUF.read_bytes(), "dummy.gguf")]
    )
    assert sha256(GOLDEN_CNCF_CONFIG) == GOLDEN_CNCF_CONFIG_DIGEST
    assert sha256(expected_manifest) == GOLDEN_CNCF_ID
    assert built.config_bytes == GOLDEN_CNCF_CONFIG
    assert built.manifest_bytes == expected_manifest


def test_extras_are_retyped_and_appended_in_dmr_package_order(tmp_path: Path, utc: None) -> None:
    # follows cmd/cli/commands/package.go (licenses, chat template, projector), builder.go
    # (resolveLayerMediaType: MapLayerMediaType without a path), internal/mutate/model.go
    # (rawCNCFConfigFile: diffIds appended); builder_test.go: TestFromPathCNCFWithAdditionalLayers
    gguf, license_path, template, mmproj = assets(
        tmp_path, "dummy.gguf", "license.txt", "template.jinja", "dummy.mmproj"
    )
    spec = PackageSpec(
        gguf=gguf, licenses=[license_path], chat_template=template, mmproj=mmproj, format="cncf"
    )
    built = build_artifact(spec, HashingSink())
    files = [(RAW, gguf), (DOC_RAW, license_path), (CONFIG_RAW, template), (RAW, mmproj)]
    config = cncf_config("llama", [sha256(path.read_bytes()) for _, path in files], DUMMY_CONFIG_FIELDS)
    manifest = cncf_manifest(config, [layer_json(kind, path.read_bytes(), path.name) for kind, path in files])
    assert sha256(manifest) == GOLDEN_CNCF_EXTRAS_ID
    assert built.config_bytes == config
    assert built.manifest_bytes == manifest


def safetensors_folder(root: Path) -> Path:
    """A small Hugging Face style folder; each file mode 0644 with the fixed mtime."""
    header = json.dumps(
        {
            "__metadata__": {"architecture": "TinyForCausalLM"},
            "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    files = {
        "model.safetensors": struct.pack("<Q", len(header)) + header + bytes(8),
        "config.json": b'{"max_position_embeddings": 2048}\n',
        "tokenizer.json": b'{"version": "1.0"}\n',
        "README.md": b"# tiny\n",
        "LICENSE": b"MIT\n",
        "chat_template.jinja": b"{{ messages }}\n",
    }
    root.mkdir(parents=True)
    for name, data in files.items():
        path = root / name
        path.write_bytes(data)
        os.chmod(path, 0o644)
        os.utime(path, ns=(FIXED_NS, FIXED_NS))
    return root


def test_safetensors_folder_gives_dmrs_cncf_artifact(tmp_path: Path, utc: None) -> None:
    # follows builder/from_directory.go (the CNCF branch: every layer re-typed by MapLayerMediaType with its
    # path; README.md is a model file there, so weight config, not documentation)
    root = safetensors_folder(tmp_path / "tiny")
    built = build_artifact(PackageSpec(safetensors_dir=root, format="cncf"), HashingSink())
    order = [
        ("LICENSE", DOC_RAW),
        ("README.md", CONFIG_RAW),
        ("chat_template.jinja", CONFIG_RAW),
        ("config.json", CONFIG_RAW),
        ("model.safetensors", RAW),
        ("tokenizer.json", CONFIG_RAW),
    ]
    datas = [(root / name).read_bytes() for name, _ in order]
    config = cncf_config(
        "TinyForCausalLM",
        [sha256(data) for data in datas],
        '{"architecture":"TinyForCausalLM","format":"safetensors","paramSize":"2.00","quantization":"F32"}',
    )
    layers = [layer_json(kind, data, name) for (name, kind), data in zip(order, datas, strict=True)]
    manifest = cncf_manifest(config, layers)
    assert sha256(manifest) == GOLDEN_CNCF_FOLDER_ID
    assert built.config_bytes == config
    assert built.manifest_bytes == manifest


def test_context_size_is_refused_with_cncf(tmp_path: Path) -> None:
    # follows builder/builder.go: WithContextSize (builder_test.go: TestFromPathCNCFContextSizeError)
    for spec in (
        PackageSpec(gguf=DUMMY_GGUF, context_size=4096, format="cncf"),
        PackageSpec(context_size=4096, format="cncf"),
    ):
        with pytest.raises(BadRequest, match="--context-size is not supported with --format cncf"):
            if spec.gguf is None:
                extend_artifact(parse_manifest(GOLDEN_MANIFEST), GOLDEN_CONFIG, spec, HashingSink())
            else:
                build_artifact(spec, HashingSink())


def test_a_docker_model_converted_with_from(tmp_path: Path, utc: None) -> None:
    # follows builder/builder.go: FromModel + WithFormat(cncf) (convertToCNCF: layers re-typed by
    # MapLayerMediaType with their paths, DockerConfigToModelPack over the layers' diff IDs), then
    # WithLicense; builder_test.go: TestFromModelToCNCF (same digests, new media types)
    [license_path] = assets(tmp_path, "license.txt")
    built = extend_artifact(
        parse_manifest(GOLDEN_MANIFEST),
        GOLDEN_CONFIG,
        PackageSpec(licenses=[license_path], format="cncf"),
        HashingSink(),
    )
    gguf, license_text = DUMMY_GGUF.read_bytes(), license_path.read_bytes()
    config = cncf_config("llama", [sha256(gguf), sha256(license_text)], DUMMY_CONFIG_FIELDS)
    manifest = cncf_manifest(
        config, [layer_json(RAW, gguf, "dummy.gguf"), layer_json(DOC_RAW, license_text, "license.txt")]
    )
    assert sha256(manifest) == GOLDEN_CNCF_CONVERTED_ID
    assert built.config_bytes == config
    assert built.manifest_bytes == manifest


def test_from_a_cncf_model_keeps_its_format(tmp_path: Path, utc: None) -> None:
    # follows builder/builder.go: FromModel without WithFormat detects a ModelPack config and stays CNCF
    # (IsModelPackConfig); the appended license is doc.v1.raw
    [gguf, license_path] = assets(tmp_path, "dummy.gguf", "license.txt")
    base = build_artifact(PackageSpec(gguf=gguf, format="cncf"), HashingSink())
    built = extend_artifact(
        base.manifest, base.config_bytes, PackageSpec(licenses=[license_path]), HashingSink()
    )
    assert [layer.media_type for layer in built.manifest.layers] == [RAW, DOC_RAW]
    assert built.manifest.artifact_type == mt.CNCF_MANIFEST_ARTIFACT_TYPE
    assert json.loads(built.config_bytes)["modelfs"]["diffIds"] == [
        DUMMY_DIGEST,
        sha256(license_path.read_bytes()),
    ]
    # ... and as DMR's convertToCNCF is idempotent on its own output, `--from` it alone is the same model
    same = extend_artifact(base.manifest, base.config_bytes, PackageSpec(format="cncf"), HashingSink())
    assert same.manifest_bytes == base.manifest_bytes
    # Safer than DMR, which would write the ModelPack config under a Docker media type:
    with pytest.raises(BadRequest, match="cannot be repackaged in the Docker format"):
        extend_artifact(base.manifest, base.config_bytes, PackageSpec(format="docker"), HashingSink())


@pytest.mark.parametrize(
    ("media_type", "path", "expected"),
    [
        (mt.GGUF, "dummy.gguf", RAW),
        (mt.SAFETENSORS, "model.safetensors", RAW),
        (mt.DDUF, "x.dduf", RAW),
        (mt.MMPROJ, "dummy.mmproj", RAW),
        (mt.LICENSE, "license.txt", DOC_RAW),
        (mt.CHAT_TEMPLATE, "template.jinja", CONFIG_RAW),
        (mt.MODEL_FILE, "README.md", CONFIG_RAW),  # a known type decides alone
        (mt.VLLM_CONFIG_TAR, "", CONFIG_RAW),
        (mt.CNCF_WEIGHT_GGUF, "", RAW),  # DMR's older typed weights become raw
        (mt.CNCF_DOC_RAW, "x", DOC_RAW),
        (mt.CNCF_WEIGHT_CONFIG_RAW, "x.gguf", CONFIG_RAW),
        # other types go by the path (files.Classify), .md files being documentation
        (mt.DIR_TAR, "notes.md", DOC_RAW),
        (mt.DIR_TAR, "NOTICE", DOC_RAW),
        (mt.DIR_TAR, "a/b.safetensors", RAW),
        (mt.DIR_TAR, "chat_template.json", CONFIG_RAW),
        (mt.DIR_TAR, "vocab.txt", CONFIG_RAW),
        (mt.DIR_TAR, "blob", CONFIG_RAW),
        (mt.DIR_TAR, "", CONFIG_RAW),  # no path: weight config
    ],
)
def test_layer_media_types_follow_classify_layer(media_type: str, path: str, expected: str) -> None:
    # follows modelpack/convert.go: ClassifyLayer, classifyByPath, LayerKindToMediaType
    assert modelpack.cncf_layer_media_type(media_type, path) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # unknown fields dropped, keys matched case-insensitively, the last duplicate wins, null in a
        # []string is "", an empty slice is omitted, a false *bool is kept, +00:00 becomes Z
        (
            '{"descriptor":{"createdAt":"2025-01-02T03:04:05.120000+00:00","Family":"qwen","name":"x",'
            '"name":"y","authors":["a",null]},"modelfs":{"type":"layers","diffIds":null},'
            '"config":{"format":"GGUF","capabilities":{"reasoning":false,"inputTypes":[]},"extra":1},'
            '"more":true}',
            '{"descriptor":{"createdAt":"2025-01-02T03:04:05.12Z","authors":["a",""],"family":"qwen",'
            '"name":"y"},"modelfs":{"type":"layers","diffIds":null},'
            '"config":{"format":"GGUF","capabilities":{"reasoning":false}}}',
        ),
        (
            '{"descriptor":{"createdAt":"2025-01-02T03:04:05.5+05:30"},"modelfs":{"diffIds":["sha256:1"]},'
            '"config":{}}',
            '{"descriptor":{"createdAt":"2025-01-02T03:04:05.5+05:30"},"modelfs":{"type":"",'
            '"diffIds":["sha256:1"]},"config":{}}',
        ),
        # more than nine fraction digits are cut; HTML characters escaped; a null struct stays empty
        (
            '{"descriptor":{"createdAt":"2025-01-02T03:04:05.1234567891Z","title":"a<b>&c\\u2028"},'
            '"modelfs":{"type":"layers"},"config":null}',
            '{"descriptor":{"createdAt":"2025-01-02T03:04:05.123456789Z",'
            '"title":"a\\u003cb\\u003e\\u0026c\\u2028"},"modelfs":{"type":"layers","diffIds":null},"config":{}}',
        ),
    ],
)
def test_a_modelpack_config_goes_through_go_unmarshal_and_marshal(given: str, expected: str) -> None:
    # follows internal/mutate/model.go: rawCNCFConfigFile (json.Unmarshal into modelpack.Model, Marshal);
    # the expected bytes are Go's
    assert modelpack.reencode(given.encode()) == expected.encode()


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ('{"descriptor":{"createdAt":"2025-02-30T03:04:05Z"}}', "valid time"),  # Go: day out of range
        ('{"config":{"paramSize":8}}', "paramSize is not a string"),  # Go: cannot unmarshal number
        ('{"modelfs":{"diffIds":"sha256:1"}}', "diffIds is not an array"),
        ("[1]", "not an object"),
    ],
)
def test_a_modelpack_config_go_cannot_read_is_refused(given: str, error: str) -> None:
    with pytest.raises(InvalidArtifact, match=error):
        modelpack.reencode(given.encode())


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"descriptor": {"createdAt": "2025-01-15T10:30:00Z"}, "config": {"paramSize": "8B"}}', True),
        (b'{"config": {"parameters": "8B", "format": "gguf"}, "descriptor": {"created": "x"}}', False),
        (b"{}", False),
        (b"not json", False),
        (b"", False),
        (b'{"descriptor": {"createdAt": "2025-01-01T00:00:00Z"}}', True),
        (b'{"modelfs": {"type": "layers", "diffIds": []}}', True),
        (b'{"config": {"description": "paramSize is 8B"}}', False),
        (b'{"descriptor": {"note": "createdAt was yesterday"}}', False),
    ],
)
def test_is_modelpack_config(raw: bytes, expected: bool) -> None:
    # follows modelpack/types_test.go: TestIsModelPackConfig
    assert modelpack.is_modelpack_config(raw) is expected


def test_the_api_shows_dmrs_normalised_config() -> None:
    # follows inference/models/adapter.go: normalizeConfig (format via GetFormat, lowercased; parameters and,
    # as GetSize does, size from paramSize; architecture from config.architecture; no context size) and
    # partial.Descriptor (created from descriptor.createdAt)
    config = parse_config_blob(
        b'{"descriptor":{"createdAt":"2025-06-15T12:00:00Z","family":"llama3"},'
        b'"modelfs":{"type":"layers","diffIds":[]},'
        b'"config":{"architecture":"transformer","format":"GGUF","paramSize":"8b","precision":"bf16"}}',
        mt.CONFIG_CNCF,
    )
    assert config.config == {
        "format": "gguf",
        "parameters": "8b",
        "architecture": "transformer",
        "size": "8b",
    }
    assert config.created == FIXED_EPOCH
    assert config.context_size is None


def test_a_config_without_a_format_takes_it_from_its_weights() -> None:
    # follows internal/partial/partial.go: inferFormatFromAnnotations (the first weight-typed layer whose
    # path is a weight file); the API shows the config as it is
    config = parse_config_blob(
        b'{"modelfs":{"type":"layers","diffIds":[]},"config":{"paramSize":"1b"}}',
        mt.CONFIG_CNCF,
        [(DOC_RAW, "README.md"), (CONFIG_RAW, "config.json"), (RAW, "w/model.safetensors")],
    )
    assert config.format == "safetensors" and "format" not in config.config


def test_the_id_is_the_same_through_the_store(tmp_path: Path, utc: None) -> None:
    store = ModelStore(tmp_path / "models")
    [gguf] = assets(tmp_path / "src", "dummy.gguf")
    built = build_artifact(PackageSpec(gguf=gguf, format="cncf"), StoreSink(store))
    assert store.add_model(built.manifest_bytes, ["dummy-cncf"]) == GOLDEN_CNCF_ID
    assert store.read_blob(GOLDEN_CNCF_CONFIG_DIGEST) == GOLDEN_CNCF_CONFIG
    model = store.get("dummy-cncf")
    assert model.to_api() == GOLDEN_CNCF_API


def test_dduf_with_cncf(tmp_path: Path) -> None:
    # follows format/dduf.go (architecture "diffusers", no parameters or quantization) through
    # DockerConfigToModelPack; a DDUF layer is weight.v1.raw
    from tests.models import write_tiny_dduf

    path = write_tiny_dduf(tmp_path / "tiny.dduf")
    built = build_artifact(PackageSpec(dduf=path, format="cncf"), HashingSink())
    doc: dict[str, Any] = json.loads(built.config_bytes)
    assert doc["config"] == {"architecture": "diffusers", "format": "dduf"}
    assert doc["descriptor"] == {"createdAt": "2025-06-15T12:00:00Z", "family": "diffusers"}
    assert [layer.media_type for layer in built.manifest.layers] == [RAW]
