"""Stores written by earlier modelrunner versions are migrated to DMR's tag form in place: atomically,
under the store lock, once, with nothing lost when the migration is interrupted.

Earlier versions stored `index.docker.io/...` tags and lowercased Hugging Face tags; DMR stores
`docker.io/...` (internal/store/index_test.go) and keeps a Hugging Face tag's case
(distribution/normalize_test.go). DMR itself migrates `hf.co/` tags the same way on start
(distribution/client.go: migrateHFTags).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from modelrunner.store.store import ModelStore
from tests.conformance.dmr_layout import (
    DUMMY_GGUF,
    GGUF,
    DMRModel,
    golden_dummy,
    layer_json,
    manifest_json,
    sha256,
    write_dmr_store,
)

HF_REPO = "huggingface.co/bartowski/llama-3.2-1b-instruct-gguf"


def model_with_file(file_name: str, created: str) -> DMRModel:
    """dummy.gguf's bytes stored under another file name (as a Hugging Face pull names its layer)."""
    data = DUMMY_GGUF.read_bytes()
    config = (
        '{"config":{"format":"gguf","quantization":"MOSTLY_Q4_K_M"},'
        f'"descriptor":{{"created":"{created}"}},'
        f'"rootfs":{{"type":"rootfs","diff_ids":["{sha256(data)}"]}}}}'
    ).encode()
    return DMRModel(
        manifest_json(config, [layer_json(GGUF, data, file_name)]), config, {sha256(data): data}, []
    )


OLD_TAGS = [
    ["index.docker.io/ai/dummy:latest", "index.docker.io/myorg/dummy:v1"],
    [f"{HF_REPO}:q4_k_m"],  # lowercased by an earlier version; the file name keeps the case
    ["hf.co/org/repo:latest"],  # DMR's own legacy form (migrateHFTags)
    ["huggingface.co/org/other:custom"],  # no spelling to recover: kept as it is
]
NEW_TAGS = [
    ["docker.io/ai/dummy:latest", "docker.io/myorg/dummy:v1"],
    [f"{HF_REPO}:Q4_K_M"],
    ["huggingface.co/org/repo:latest"],
    ["huggingface.co/org/other:custom"],
]


def old_models() -> list[DMRModel]:
    files = ["Llama-3.2-1B-Instruct-Q4_K_M.gguf", "model.gguf", "custom-model.gguf"]
    created = ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"]
    others = [model_with_file(name, when) for name, when in zip(files, created, strict=True)]
    models = [golden_dummy(None), *others]
    return [DMRModel(m.manifest, m.config, m.blobs, tags) for m, tags in zip(models, OLD_TAGS, strict=True)]


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    """A store as an earlier modelrunner left it: its tags, its lock file, no migration marker."""
    root = tmp_path / "models"
    write_dmr_store(root, old_models())
    (root / ".models.json.lock").touch()
    return root


def tags_on_disk(root: Path) -> list[list[str]]:
    return [entry["tags"] for entry in json.loads((root / "models.json").read_text())["models"]]


def test_an_old_store_is_migrated_in_place(old_store: Path) -> None:
    ids = [m.id for m in old_models()]
    store = ModelStore(old_store)
    assert tags_on_disk(old_store) == NEW_TAGS
    assert [m.id for m in store.list_models()] == ids  # IDs, manifests and blobs untouched
    assert store.get("dummy").id == ids[0]
    assert store.get("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M").id == ids[1]
    assert store.get("hf.co/org/repo").id == ids[2]
    for model in old_models():
        assert (old_store / "manifests" / "sha256" / model.id.removeprefix("sha256:")).read_bytes() == (
            model.manifest
        )


def test_migration_happens_once(old_store: Path) -> None:
    ModelStore(old_store)
    # A lowercase Hugging Face tag typed after the migration stays as typed, as DMR keeps it.
    store = ModelStore(old_store)
    store.tag("hf.co/org/other:custom", "hf.co/org/other:q8_0")
    ModelStore(old_store)
    assert tags_on_disk(old_store)[3] == ["huggingface.co/org/other:custom", "huggingface.co/org/other:q8_0"]


def test_a_dmr_store_keeps_a_lowercase_hugging_face_tag(tmp_path: Path) -> None:
    # A DMR store (no modelrunner lock file): DMR kept `q4_k_m` as its user typed it, so it stays.
    root = tmp_path / "models"
    models = old_models()
    write_dmr_store(
        root, [DMRModel(models[1].manifest, models[1].config, models[1].blobs, [f"{HF_REPO}:q4_k_m"])]
    )
    before = (root / "models.json").read_bytes()
    assert ModelStore(root).get("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:q4_k_m").id == models[1].id
    assert (root / "models.json").read_bytes() == before


DIE_AT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    target = sys.argv[2]
    real_replace = os.replace
    def replace(src, dst):
        if Path(dst).name == target:
            os._exit(9)  # killed between writing the new file and renaming it into place
        real_replace(src, dst)
    os.replace = replace
    from modelrunner.store.store import ModelStore
    ModelStore(Path(sys.argv[1]))
    """
)


def run_until_killed(root: Path, file_name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", DIE_AT, str(root), file_name], capture_output=True, timeout=60
    )
    assert result.returncode == 9, result.stderr.decode()


def test_a_migration_killed_before_the_index_is_replaced_loses_nothing(old_store: Path) -> None:
    before = (old_store / "models.json").read_bytes()
    run_until_killed(old_store, "models.json")
    assert (old_store / "models.json").read_bytes() == before  # the old index, whole
    assert list(old_store.glob(".models.json.*.tmp"))  # what the killed process had written
    assert not (old_store / ".modelrunner-tags-v2").exists()
    store = ModelStore(old_store)  # the next open migrates again
    assert tags_on_disk(old_store) == NEW_TAGS
    assert [m.id for m in store.list_models()] == [m.id for m in old_models()]
    assert not list(old_store.glob(".models.json.*.tmp"))


def test_a_migration_killed_before_its_marker_is_written_finishes_on_the_next_open(old_store: Path) -> None:
    run_until_killed(old_store, ".modelrunner-tags-v2")
    assert tags_on_disk(old_store) == NEW_TAGS  # the index was already replaced
    ModelStore(old_store)
    assert tags_on_disk(old_store) == NEW_TAGS
    assert (old_store / ".modelrunner-tags-v2").exists()


def test_a_migration_that_fails_leaves_the_old_index(
    old_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    before = (old_store / "models.json").read_bytes()
    real_replace = os.replace

    def failing_replace(src: str, dst: str) -> None:
        if Path(dst).name == "models.json":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    store = ModelStore(old_store)  # opens all the same: lookups match the old tags too
    assert (old_store / "models.json").read_bytes() == before
    assert not list(old_store.glob(".models.json.*.tmp"))  # cleaned up by the writer itself
    assert store.get("dummy").id == old_models()[0].id
    assert store.get("ai/dummy:latest").id == old_models()[0].id
    monkeypatch.setattr(os, "replace", real_replace)
    ModelStore(old_store)
    assert tags_on_disk(old_store) == NEW_TAGS
