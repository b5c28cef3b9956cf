"""`model package` (artifact/builder.py) into the store, against contract 3.1-3.3.

The store sink mirrors server/models_api.py's _StoreSink (conftest.StoreSink); HashingSink must agree with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelrunner.artifact import gojson
from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.builder import (
    BuiltArtifact,
    HashingSink,
    PackageSpec,
    build_artifact,
    classify,
    created_time,
    extend_artifact,
    local_zone,
)
from modelrunner.artifact.manifest import Descriptor, Manifest, parse_manifest, sha256_digest
from modelrunner.errors import BadRequest, InvalidArtifact, InvalidModelFile
from modelrunner.fileio import hash_file
from modelrunner.store.store import ModelStore
from tests.models import (
    CHAT_TEMPLATE,
    write_safetensors,
    write_tiny_dduf,
    write_tiny_gguf,
    write_tiny_gguf_shards,
    write_tiny_safetensors_dir,
)

CREATED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


@contextlib.contextmanager
def fails_instead_of_hanging(seconds: int = 60) -> Iterator[None]:
    """A guard, not a timing assertion: opening a FIFO blocks forever, so turn a hang into a failure."""

    def _blocked(signum: int, frame: Any) -> None:
        raise TimeoutError("the builder blocked (did it open a FIFO?)")

    previous = signal.signal(signal.SIGALRM, _blocked)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def build(store: ModelStore, new_sink: Callable[[], Any]) -> Callable[[PackageSpec], BuiltArtifact]:
    """Package a spec into the store and register it (untagged), as `POST /models/create` does."""

    def _build(spec: PackageSpec) -> BuiltArtifact:
        with fails_instead_of_hanging():
            built = build_artifact(spec, new_sink(), created=CREATED)
        store.add_model(built.manifest_bytes)
        return built

    return _build


def config_of(built: BuiltArtifact) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(built.config_bytes)
    return config


def metadata_of(layer: Descriptor) -> dict[str, Any]:
    metadata: dict[str, Any] = json.loads(layer.annotations[mt.ANNOTATION_FILE_METADATA])
    return metadata


def assert_consistent(store: ModelStore, built: BuiltArtifact) -> None:
    """Manifest bytes parse back to the manifest; every blob is in the store; diff_ids are the layers."""
    assert parse_manifest(built.manifest_bytes) == built.manifest
    assert built.manifest.config.digest == sha256_digest(built.config_bytes)
    assert built.manifest.config.size == len(built.config_bytes)
    for blob in built.manifest.blobs:
        assert store.has_blob(blob.digest, blob.size)
    assert config_of(built)["rootfs"] == {
        "type": "rootfs",
        "diff_ids": [layer.digest for layer in built.manifest.layers],
    }


# --- GGUF --------------------------------------------------------------------------------------------------


def test_single_gguf_gives_one_annotated_gguf_layer_and_a_v01_config(
    store: ModelStore, tiny_gguf: Path, build: Any
) -> None:
    built = build(PackageSpec(gguf=tiny_gguf))
    manifest = built.manifest
    assert manifest.media_type == mt.OCI_MANIFEST
    assert manifest.config.media_type == mt.CONFIG_V01
    [layer] = manifest.layers
    assert layer.media_type == mt.GGUF
    assert (layer.digest, layer.size) == hash_file(tiny_gguf)
    assert layer.annotations[mt.ANNOTATION_FILEPATH] == "tiny.gguf"
    assert layer.annotations[mt.ANNOTATION_MEDIATYPE_UNTESTED] == "false"
    st = tiny_gguf.stat()
    metadata = metadata_of(layer)
    assert metadata["name"] == "tiny.gguf"
    assert metadata["size"] == st.st_size
    assert metadata["mode"] == stat.S_IMODE(st.st_mode) & 0o777  # Go's FileMode.Perm()
    assert (metadata["uid"], metadata["gid"], metadata["typeflag"]) == (0, 0, 0)
    # Go's time.Time JSON: nanoseconds, local zone (follows internal/partial/layer.go)
    assert metadata["mtime"] == gojson.local_rfc3339nano(st.st_mtime_ns)
    assert datetime.fromisoformat(metadata["mtime"].replace("Z", "+00:00")).timestamp() == pytest.approx(
        st.st_mtime, abs=1e-6
    )

    doc = config_of(built)
    config = doc["config"]
    assert config["format"] == "gguf"
    assert config["context_size"] == 512
    assert config["architecture"] == "llama"
    assert config["quantization"] == "MOSTLY_F32"  # gguf-parser's GGUFFileType name, as DMR
    assert config["parameters"].endswith("K")
    assert config["size"].endswith("KiB")  # gguf-parser's units
    assert config["gguf"]["general.architecture"] == "llama"
    assert doc["descriptor"] == {"created": "2025-01-02T03:04:05Z"}
    assert_consistent(store, built)


@pytest.mark.parametrize("given", [0, 1, 2])
def test_any_shard_of_a_gguf_set_packages_all_shards_in_order(
    store: ModelStore, tmp_path: Path, given: int, build: Any
) -> None:
    shards = write_tiny_gguf_shards(tmp_path, n=3)
    built = build(PackageSpec(gguf=shards[given]))
    assert [layer.filepath for layer in built.manifest.layers] == [s.name for s in shards]
    assert [layer.digest for layer in built.manifest.layers] == [hash_file(s)[0] for s in shards]
    assert all(layer.media_type == mt.GGUF for layer in built.manifest.layers)
    assert config_of(built)["config"]["architecture"] == "llama"
    assert_consistent(store, built)


def test_shard_sets_give_the_same_artifact_from_any_member(
    store: ModelStore, tmp_path: Path, build: Any
) -> None:
    shards = write_tiny_gguf_shards(tmp_path, n=2)
    first = build(PackageSpec(gguf=shards[0]))
    second = build(PackageSpec(gguf=shards[1]))
    assert first.manifest_bytes == second.manifest_bytes


# --- safetensors -------------------------------------------------------------------------------------------


def hf_folder(tmp_path: Path) -> Path:
    """The tiny HF folder plus things packaging must skip: a dot-folder, symlinks, a FIFO."""
    folder = write_tiny_safetensors_dir(tmp_path / "hf")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]\n")
    (folder / "linked.txt").symlink_to(folder / "sub" / "extra.txt")
    (folder / "linked-dir").symlink_to(folder / "sub")
    os.mkfifo(folder / "pipe")
    return folder


EXPECTED_SAFETENSORS_LAYERS = {
    "LICENSE": mt.LICENSE,
    "chat_template.jinja": mt.CHAT_TEMPLATE,
    "config.json": mt.MODEL_FILE,
    "model.safetensors": mt.SAFETENSORS,
    "sub/extra.txt": mt.MODEL_FILE,
    "tokenizer.json": mt.MODEL_FILE,
    "tokenizer_config.json": mt.MODEL_FILE,
}


def test_safetensors_folder_gives_one_classified_layer_per_file_and_a_v02_config(
    store: ModelStore, tmp_path: Path, build: Any
) -> None:
    folder = hf_folder(tmp_path)
    built = build(PackageSpec(safetensors_dir=folder))
    assert built.manifest.config.media_type == mt.CONFIG_V02
    layers = {layer.filepath: layer for layer in built.manifest.layers}
    assert len(layers) == len(built.manifest.layers)
    assert {path: layer.media_type for path, layer in layers.items()} == EXPECTED_SAFETENSORS_LAYERS
    for path, layer in layers.items():
        assert (layer.digest, layer.size) == hash_file(folder / path)
        assert metadata_of(layer)["name"] == path.rsplit("/", 1)[-1]  # the base name, as DMR
        assert layer.annotations[mt.ANNOTATION_MEDIATYPE_UNTESTED] == "false"
    config = config_of(built)["config"]
    assert config["format"] == "safetensors"
    assert config["quantization"] == "F32"
    assert config["context_size"] == 512  # from config.json's max_position_embeddings
    assert config["safetensors"]["format"] == "pt"
    assert_consistent(store, built)


@pytest.mark.parametrize(
    ("name", "media_type"),
    [
        ("model.safetensors", mt.SAFETENSORS),
        ("Model-00001-of-00002.SAFETENSORS", mt.SAFETENSORS),
        ("x.gguf", mt.GGUF),
        ("pipeline.dduf", mt.DDUF),
        ("template.jinja", mt.CHAT_TEMPLATE),
        ("chat_template.json", mt.CHAT_TEMPLATE),
        ("LICENSE", mt.LICENSE),
        ("LICENSE.md", mt.LICENSE),
        ("licence.txt", mt.LICENSE),
        ("COPYING", mt.LICENSE),
        ("NOTICE", mt.LICENSE),
        ("config.json", mt.MODEL_FILE),
        ("README.md", mt.MODEL_FILE),
        ("tokenizer.model", mt.MODEL_FILE),
        ("vocab.txt", mt.MODEL_FILE),
        ("merges", mt.MODEL_FILE),
    ],
)
def test_classifier_follows_dmr_rules(name: str, media_type: str) -> None:
    assert classify(name) == media_type


def test_sharded_safetensors_folder_packages_every_shard(
    store: ModelStore, tmp_path: Path, build: Any
) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    for i in (1, 2):
        write_safetensors(folder / f"model-0000{i}-of-00002.safetensors", {f"w{i}": np.ones(4, np.float32)})
    built = build(PackageSpec(safetensors_dir=folder))
    assert [layer.filepath for layer in built.manifest.layers] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


# --- DDUF --------------------------------------------------------------------------------------------------


def test_dduf_gives_one_dduf_layer(store: ModelStore, tmp_path: Path, build: Any) -> None:
    dduf = write_tiny_dduf(tmp_path / "pipeline.dduf")
    built = build(PackageSpec(dduf=dduf))
    [layer] = built.manifest.layers
    assert layer.media_type == mt.DDUF
    assert layer.filepath == "pipeline.dduf"
    config = config_of(built)["config"]
    assert config["format"] == "dduf"
    assert config["architecture"] == "diffusers"
    assert config["diffusers"] == {"layout": "dduf", "dduf_file": "pipeline.dduf"}
    assert_consistent(store, built)


# --- extras ------------------------------------------------------------------------------------------------


def test_licenses_chat_template_and_mmproj_are_appended_as_layers(
    store: ModelStore, tiny_gguf: Path, tmp_path: Path, build: Any
) -> None:
    extras = tmp_path / "extras"
    extras.mkdir()
    (extras / "LICENSE").write_text("Apache-2.0\n")
    (extras / "NOTICE.txt").write_text("notice\n")
    (extras / "template.jinja").write_text(CHAT_TEMPLATE)
    mmproj = write_tiny_gguf(extras / "mmproj-f16.gguf", seed=3)
    spec = PackageSpec(
        gguf=tiny_gguf,
        licenses=[extras / "LICENSE", extras / "NOTICE.txt"],
        mmproj=mmproj,
        chat_template=extras / "template.jinja",
    )
    built = build(spec)
    assert [(layer.media_type, layer.filepath) for layer in built.manifest.layers] == [
        (mt.GGUF, "tiny.gguf"),
        (mt.LICENSE, "LICENSE"),
        (mt.LICENSE, "NOTICE.txt"),
        (mt.CHAT_TEMPLATE, "template.jinja"),  # DMR's package order: licenses, template, mmproj
        (mt.MMPROJ, "mmproj-f16.gguf"),
    ]
    assert_consistent(store, built)


def test_extras_can_be_added_to_a_safetensors_folder(store: ModelStore, tmp_path: Path, build: Any) -> None:
    folder = write_tiny_safetensors_dir(tmp_path / "hf")
    (tmp_path / "EXTRA-LICENSE").write_text("extra\n")
    built = build(PackageSpec(safetensors_dir=folder, licenses=[tmp_path / "EXTRA-LICENSE"]))
    assert built.manifest.layers[-1].filepath == "EXTRA-LICENSE"
    assert built.manifest.layers[-1].media_type == mt.LICENSE


@pytest.mark.parametrize("context_size", [1, 8192, 2**31 - 1])
def test_context_size_overrides_the_model_value(
    store: ModelStore, tiny_gguf: Path, context_size: int, build: Any
) -> None:
    built = build(PackageSpec(gguf=tiny_gguf, context_size=context_size))
    assert config_of(built)["config"]["context_size"] == context_size
    assert store.get(sha256_digest(built.manifest_bytes)).config.context_size == context_size


# --- refusals ----------------------------------------------------------------------------------------------


def _fifo(tmp_path: Path, name: str) -> Path:
    os.mkfifo(tmp_path / name)
    return tmp_path / name


def _file(tmp_path: Path, name: str, data: bytes) -> Path:
    (tmp_path / name).write_bytes(data)
    return tmp_path / name


def _truncated_gguf(tmp_path: Path, gguf: Path) -> Path:
    return _file(tmp_path, "truncated.gguf", gguf.read_bytes()[: gguf.stat().st_size // 2])


def _incomplete_shards(tmp_path: Path) -> Path:
    (tmp_path / "shards").mkdir()
    shards = write_tiny_gguf_shards(tmp_path / "shards", n=2)
    shards[1].unlink()
    return shards[0]


def _two_licenses_named_alike(tmp_path: Path, gguf: Path) -> PackageSpec:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "LICENSE").write_text(f"licence {folder}\n")
    return PackageSpec(gguf=gguf, licenses=[tmp_path / "a" / "LICENSE", tmp_path / "b" / "LICENSE"])


def _folder_without_safetensors(tmp_path: Path) -> PackageSpec:
    folder = write_tiny_safetensors_dir(tmp_path / "hf")
    (folder / "model.safetensors").unlink()
    return PackageSpec(safetensors_dir=folder)


def _folder_with_incomplete_shards(tmp_path: Path) -> PackageSpec:
    folder = tmp_path / "sharded"
    folder.mkdir()
    write_safetensors(folder / "model-00001-of-00002.safetensors", {"w": np.ones(4, np.float32)})
    return PackageSpec(safetensors_dir=folder)


def _folder_with_unsafe_name(tmp_path: Path) -> PackageSpec:
    folder = write_tiny_safetensors_dir(tmp_path / "hf")
    (folder / "back\\slash.txt").write_text("x")
    return PackageSpec(safetensors_dir=folder)


REFUSALS: dict[str, tuple[Callable[[Path, Path], PackageSpec], type[Exception]]] = {
    "no source": (lambda t, g: PackageSpec(), BadRequest),
    "only extras": (lambda t, g: PackageSpec(licenses=[g]), BadRequest),
    "gguf and dduf": (lambda t, g: PackageSpec(gguf=g, dduf=g), BadRequest),
    "gguf and safetensors folder": (lambda t, g: PackageSpec(gguf=g, safetensors_dir=t), BadRequest),
    "missing gguf": (lambda t, g: PackageSpec(gguf=t / "missing.gguf"), BadRequest),
    "missing dduf": (lambda t, g: PackageSpec(dduf=t / "missing.dduf"), BadRequest),
    "missing safetensors folder": (lambda t, g: PackageSpec(safetensors_dir=t / "missing"), BadRequest),
    "file as safetensors folder": (lambda t, g: PackageSpec(safetensors_dir=g), BadRequest),
    "missing license": (lambda t, g: PackageSpec(gguf=g, licenses=[t / "LICENSE"]), BadRequest),
    "missing mmproj": (lambda t, g: PackageSpec(gguf=g, mmproj=t / "mmproj.gguf"), BadRequest),
    "missing chat template": (lambda t, g: PackageSpec(gguf=g, chat_template=t / "t.jinja"), BadRequest),
    "directory as gguf": (lambda t, g: PackageSpec(gguf=t), BadRequest),
    "directory as license": (lambda t, g: PackageSpec(gguf=g, licenses=[t]), BadRequest),
    "FIFO as gguf": (lambda t, g: PackageSpec(gguf=_fifo(t, "pipe.gguf")), BadRequest),
    "FIFO as license": (lambda t, g: PackageSpec(gguf=g, licenses=[_fifo(t, "LICENSE")]), BadRequest),
    "FIFO as mmproj": (lambda t, g: PackageSpec(gguf=g, mmproj=_fifo(t, "mmproj")), BadRequest),
    "FIFO as chat template": (
        lambda t, g: PackageSpec(gguf=g, chat_template=_fifo(t, "t.jinja")),
        BadRequest,
    ),
    "FIFO as dduf": (lambda t, g: PackageSpec(dduf=_fifo(t, "x.dduf")), BadRequest),
    "/dev/null as gguf": (lambda t, g: PackageSpec(gguf=Path("/dev/null")), BadRequest),
    "/dev/null as license": (lambda t, g: PackageSpec(gguf=g, licenses=[Path("/dev/null")]), BadRequest),
    "non-UTF-8 chat template": (
        lambda t, g: PackageSpec(gguf=g, chat_template=_file(t, "t.jinja", b"{{ \xff\xfe }}")),
        BadRequest,
    ),
    "chat template over 1 MiB": (
        lambda t, g: PackageSpec(gguf=g, chat_template=_file(t, "t.jinja", b"x" * (1024 * 1024 + 1))),
        BadRequest,
    ),
    "context size 0": (lambda t, g: PackageSpec(gguf=g, context_size=0), BadRequest),
    "context size negative": (lambda t, g: PackageSpec(gguf=g, context_size=-4096), BadRequest),
    "context size 2**31": (lambda t, g: PackageSpec(gguf=g, context_size=2**31), BadRequest),
    "context size bool": (lambda t, g: PackageSpec(gguf=g, context_size=True), BadRequest),
    "truncated gguf": (lambda t, g: PackageSpec(gguf=_truncated_gguf(t, g)), InvalidModelFile),
    "text file as gguf": (
        lambda t, g: PackageSpec(gguf=_file(t, "x.gguf", b"hello world\n")),
        InvalidModelFile,
    ),
    "empty gguf": (lambda t, g: PackageSpec(gguf=_file(t, "x.gguf", b"")), InvalidModelFile),
    "incomplete gguf shard set": (lambda t, g: PackageSpec(gguf=_incomplete_shards(t)), InvalidModelFile),
    "gguf as dduf": (lambda t, g: PackageSpec(dduf=g), InvalidModelFile),
    "two licenses with the same name": (lambda t, g: _two_licenses_named_alike(t, g), BadRequest),
    "license named like the gguf": (lambda t, g: PackageSpec(gguf=g, licenses=[g]), BadRequest),
    "folder without safetensors": (lambda t, g: _folder_without_safetensors(t), InvalidModelFile),
    "folder with incomplete shards": (lambda t, g: _folder_with_incomplete_shards(t), InvalidModelFile),
    "folder with a backslash file name": (lambda t, g: _folder_with_unsafe_name(t), InvalidArtifact),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_package_input_is_refused_and_changes_nothing(
    store: ModelStore, refuses: Any, tiny_gguf: Path, tmp_path: Path, case: str, new_sink: Any
) -> None:
    make_spec, error = REFUSALS[case]
    work = tmp_path / "work"
    work.mkdir()
    spec = make_spec(work, tiny_gguf)
    sink = new_sink()
    with fails_instead_of_hanging(), refuses(error, store) as info:
        build_artifact(spec, sink, created=CREATED)
    assert type(info.value) is error
    assert sink.added == []


def test_a_fifo_inside_a_safetensors_folder_is_skipped(store: ModelStore, tmp_path: Path, build: Any) -> None:
    folder = write_tiny_safetensors_dir(tmp_path / "hf")
    os.mkfifo(folder / "weights-pipe.safetensors")
    built = build(PackageSpec(safetensors_dir=folder))
    assert "weights-pipe.safetensors" not in {layer.filepath for layer in built.manifest.layers}


# --- reproducibility and sinks -----------------------------------------------------------------------------


def test_source_date_epoch_makes_builds_reproducible(
    store: ModelStore, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch, new_sink: Any
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    first = build_artifact(PackageSpec(gguf=tiny_gguf), new_sink())
    second = build_artifact(PackageSpec(gguf=tiny_gguf), new_sink())
    assert sha256_digest(first.manifest_bytes) == sha256_digest(second.manifest_bytes)
    assert config_of(first)["descriptor"] == {"created": "2023-11-14T22:13:20Z"}


def spec_with_everything(tmp_path: Path, tiny_gguf: Path) -> PackageSpec:
    (tmp_path / "LICENSE").write_text("MIT\n")
    (tmp_path / "t.jinja").write_text(CHAT_TEMPLATE)
    return PackageSpec(
        gguf=tiny_gguf, licenses=[tmp_path / "LICENSE"], chat_template=tmp_path / "t.jinja", context_size=1024
    )


@pytest.mark.parametrize("source", ["gguf", "safetensors", "dduf"])
def test_hashing_sink_gives_the_same_artifact_as_the_store_sink(
    store: ModelStore, tiny_gguf: Path, tmp_path: Path, source: str, new_sink: Any
) -> None:
    if source == "gguf":
        spec = spec_with_everything(tmp_path, tiny_gguf)
    elif source == "safetensors":
        spec = PackageSpec(safetensors_dir=write_tiny_safetensors_dir(tmp_path / "hf"))
    else:
        spec = PackageSpec(dduf=write_tiny_dduf(tmp_path / "x.dduf"))
    hashing = HashingSink()
    from_store = build_artifact(spec, new_sink(), created=CREATED)
    from_hashing = build_artifact(spec, hashing, created=CREATED)
    assert from_hashing.manifest_bytes == from_store.manifest_bytes
    assert from_hashing.config_bytes == from_store.config_bytes
    layers = from_hashing.manifest.layers
    assert set(hashing.files) == {layer.digest for layer in layers}
    for digest, path in hashing.files.items():
        assert store.layout.blob_path(digest).read_bytes() == path.read_bytes()
    assert hashing.blobs == {from_hashing.manifest.config.digest: from_hashing.config_bytes}


# --- package --from ----------------------------------------------------------------------------------------


def test_extend_artifact_keeps_the_base_layers_and_appends_new_ones(
    store: ModelStore, tiny_model: str, tmp_path: Path, new_sink: Any
) -> None:
    base = store.get(tiny_model)
    base_config = store.read_blob(base.manifest.config.digest)
    (tmp_path / "LICENSE").write_text("MIT\n")
    (tmp_path / "t.jinja").write_text(CHAT_TEMPLATE)
    spec = PackageSpec(licenses=[tmp_path / "LICENSE"], chat_template=tmp_path / "t.jinja", context_size=2048)
    built = extend_artifact(base.manifest, base_config, spec, new_sink())
    new_id = store.add_model(built.manifest_bytes, ["ai/tiny-extended"])

    layers = built.manifest.layers
    assert layers[: len(base.manifest.layers)] == base.manifest.layers
    assert [(layer.media_type, layer.filepath) for layer in layers[len(base.manifest.layers) :]] == [
        (mt.LICENSE, "LICENSE"),
        (mt.CHAT_TEMPLATE, "t.jinja"),
    ]
    assert built.manifest.config.media_type == base.manifest.config.media_type
    config = config_of(built)["config"]
    assert config["context_size"] == 2048
    assert {k: v for k, v in config.items() if k != "context_size"} == {
        k: v for k, v in base.config.config.items() if k != "context_size"
    }
    assert_consistent(store, built)
    assert store.get("ai/tiny-extended").id == new_id != tiny_model
    assert store.get(tiny_model).manifest == base.manifest  # the base model is untouched


def _cncf_base(store: ModelStore) -> tuple[Manifest, bytes]:
    config = json.dumps({"config": {"format": "gguf"}}).encode()
    layer = Descriptor(mt.CNCF_WEIGHT_GGUF, sha256_digest(b"w"), 1)
    return Manifest(Descriptor(mt.CONFIG_CNCF, sha256_digest(config), len(config)), (layer,)), config


@pytest.mark.parametrize(
    "case", ["with --gguf", "with --dduf", "CNCF base", "context size 0", "license named like a layer"]
)
def test_extend_artifact_refuses_bad_input_and_changes_nothing(
    store: ModelStore,
    tiny_model: str,
    refuses: Any,
    tmp_path: Path,
    tiny_gguf: Path,
    case: str,
    new_sink: Any,
) -> None:
    base = store.get(tiny_model)
    manifest, config = base.manifest, store.read_blob(base.manifest.config.digest)
    spec = PackageSpec()
    if case == "with --gguf":
        spec = PackageSpec(gguf=tiny_gguf)
    elif case == "with --dduf":
        spec = PackageSpec(dduf=tiny_gguf)
    elif case == "CNCF base":
        manifest, config = _cncf_base(store)
    elif case == "context size 0":
        spec = PackageSpec(context_size=0)
    else:
        (tmp_path / "other").mkdir()
        spec = PackageSpec(licenses=[_file(tmp_path / "other", "tiny.gguf", b"not the model")])
    sink = new_sink()
    with refuses(BadRequest, store):
        extend_artifact(manifest, config, spec, sink)
    assert sink.added == []


# --- the build's environment: SOURCE_DATE_EPOCH and the time zone, this process's or a caller's -------------


def test_created_time_reads_the_environment_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert created_time() == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert created_time({"SOURCE_DATE_EPOCH": "0"}) == datetime(1970, 1, 1, tzinfo=UTC)
    for unset in ({}, {"SOURCE_DATE_EPOCH": ""}):  # the caller's, not this process's
        assert abs(created_time(unset) - datetime.now(UTC)).total_seconds() < 60


@pytest.mark.parametrize(
    ("tz", "offset_hours"),
    [
        ("Asia/Kolkata", 5.5),
        (":America/New_York", -4),  # a leading ':' as libc and Go allow
        ("/usr/share/zoneinfo/Australia/Eucla", 8.75),  # the path of a zone file
        ("", 0),
        ("UTC", 0),
        # what Go's time.Local cannot load is UTC, as for DMR's CLI
        ("Nowhere/Nothing", 0),
        ("CET-1CEST,M3.5.0,M10.5.0/3", 0),  # a POSIX rule: libc reads it, Go does not
        ("../../etc/passwd", 0),
        ("/etc/passwd", 0),  # not a zone file
    ],
)
def test_local_zone_as_go_finds_it(tz: str, offset_hours: float) -> None:
    june = datetime(2025, 6, 15, 12, tzinfo=UTC)
    assert june.astimezone(local_zone(tz)).utcoffset() == timedelta(hours=offset_hours)


def test_local_zone_unset_is_the_systems_and_never_waits_on_a_fifo(tmp_path: Path) -> None:
    from zoneinfo import ZoneInfo

    june = datetime(2025, 6, 15, 12, tzinfo=UTC)
    with open("/etc/localtime", "rb") as file:
        system = ZoneInfo.from_file(file)
    assert june.astimezone(local_zone(None)).utcoffset() == june.astimezone(system).utcoffset()
    os.mkfifo(tmp_path / "zone")
    assert local_zone(str(tmp_path / "zone")) is UTC  # a FIFO is never opened (it would block)
