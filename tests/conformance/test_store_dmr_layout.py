"""A store written by DMR opens unchanged: the same IDs, tags and listing, found by every name form,
through ModelStore and through the daemon's `GET /models/{name}` and `model ls`.

The store is laid out as DMR's store code writes it (tests/conformance/dmr_layout.py, following
pkg/distribution/internal/store and its index_test.go): tags `docker.io/ai/<name>:<tag>`, Hugging Face
tags in their own case, `"tags": null` for an untagged model, no lock file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from modelrunner.errors import ModelNotFound
from modelrunner.store.store import ModelStore
from tests.conformance.dmr_layout import (
    GOLDEN_ID,
    DMRModel,
    dummy_with_license,
    golden_dummy,
    write_dmr_store,
)
from tests.daemon import Daemon, free_port

HF_TAG = "huggingface.co/bartowski/llama-3.2-1b-instruct-gguf:Q4_K_M"


def dmr_models() -> list[DMRModel]:
    return [
        golden_dummy(["docker.io/ai/dummy:latest", "docker.io/ai/dummy:v1"]),
        dummy_with_license([HF_TAG, "docker.io/myorg/licensed:latest"]),
        dummy_with_license(None, created="2024-01-01T00:00:00Z"),
    ]


def golden_names() -> list[str]:
    hex_id = GOLDEN_ID.removeprefix("sha256:")
    return [
        "dummy",
        "dummy:latest",
        "ai/dummy",
        "ai/dummy:latest",
        "  ai/dummy  ",
        "docker.io/ai/dummy",
        "docker.io/ai/dummy:latest",
        "index.docker.io/ai/dummy:latest",
        "docker.io/dummy",  # ParseReference: a one-component Hub name is ai/
        "Dummy",  # normalizeModelName lowercases the name
        "dummy:v1",
        GOLDEN_ID,
        hex_id,
        hex_id[:12],
        f"ai/dummy@{GOLDEN_ID}",
        f"docker.io/some-org/some-repo@{GOLDEN_ID}",  # index_test.go: a digest matches the ID alone
    ]


HF_NAMES = [
    "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
    "huggingface.co/bartowski/llama-3.2-1b-instruct-gguf:Q4_K_M",
    "HF.CO/bartowski/llama-3.2-1b-instruct-gguf:Q4_K_M",
]
NOT_FOUND = [
    "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:q4_k_m",  # tags compare case-sensitively, as in DMR
    "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF",  # :latest was never pulled
    "dummy:V1",
    "docker.io/some-org/dummy",  # index_test.go: another org does not match
    "myorg/dummy",
]


@pytest.fixture
def dmr_root(tmp_path: Path) -> Path:
    root = tmp_path / "home" / "models"
    write_dmr_store(root, dmr_models())
    return root


def test_a_dmr_store_opens_unchanged(dmr_root: Path) -> None:
    models_json, layout_json = (
        (dmr_root / "models.json").read_bytes(),
        (dmr_root / "layout.json").read_bytes(),
    )
    store = ModelStore(dmr_root)
    listed = store.list_models()
    assert [(m.id, m.tags) for m in listed] == [(m.id, m.tags or []) for m in dmr_models()]
    assert (dmr_root / "models.json").read_bytes() == models_json  # no migration of a DMR store
    assert (dmr_root / "layout.json").read_bytes() == layout_json
    golden = store.get("dummy")
    assert (golden.config.config["parameters"], golden.config.config["quantization"]) == ("183", "Unknown")
    assert golden.config.created == 1_749_988_800
    assert (store.bundle("dummy") / "model" / "model.gguf").is_file()


def test_every_name_form_finds_the_model(dmr_root: Path) -> None:
    store = ModelStore(dmr_root)
    for name in golden_names():
        assert store.get(name).id == GOLDEN_ID, name
    licensed = dmr_models()[1].id
    for name in [*HF_NAMES, "myorg/licensed", "docker.io/myorg/licensed:latest"]:
        assert store.get(name).id == licensed, name
    for name in NOT_FOUND:
        with pytest.raises(ModelNotFound):
            store.get(name)


def test_tagging_and_untagging_follow_dmrs_index(dmr_root: Path) -> None:
    # follows internal/store/index_test.go: TestTag (the tag moves, stored as docker.io/ai/...; a repeated
    # tag is not added twice) and TestUntag (the untagged reference is reported in full)
    store = ModelStore(dmr_root)
    licensed = dmr_models()[1].id
    assert store.tag(licensed, "dummy:v1") == "docker.io/ai/dummy:v1"
    store.tag(licensed, "ai/dummy:v1")
    assert store.get(licensed).tags == [HF_TAG, "docker.io/myorg/licensed:latest", "docker.io/ai/dummy:v1"]
    assert store.get(GOLDEN_ID).tags == ["docker.io/ai/dummy:latest"]
    assert store.delete("myorg/licensed") == [{"Untagged": "docker.io/myorg/licensed:latest"}]
    assert store.delete("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M") == [{"Untagged": HF_TAG}]


@pytest.fixture
def daemon(dmr_root: Path) -> Iterator[Daemon]:
    running = Daemon(dmr_root.parent, free_port()).start()
    yield running
    running.stop()


def test_daemon_serves_a_dmr_store_by_every_name(daemon: Daemon) -> None:
    # follows pkg/inference/models/http_handler.go: GET /models and GET /models/{name...}
    listed = daemon.models()
    assert [(m["id"], m["tags"]) for m in listed] == [(m.id, m.tags or []) for m in dmr_models()]
    for name in [*golden_names(), *HF_NAMES]:
        response = daemon.http("GET", "/models/" + name.strip())
        assert response.status_code == 200, (name, response.text)
        assert response.json()["id"] in (GOLDEN_ID, dmr_models()[1].id)
    assert daemon.http("GET", "/models/dummy").json() == listed[0]
    for name in NOT_FOUND:
        assert daemon.http("GET", "/models/" + name).status_code == 404, name


def test_ls_shows_dmrs_names_and_values(daemon: Daemon) -> None:
    # follows cmd/cli/commands/list.go (prettyPrintModels: one row per tag, <none> for an untagged
    # model, sorted by name then tag) and utils.go: stripDefaultsFromModelName
    rows = [line.split() for line in daemon.cli("ls").stdout.splitlines()[1:]]
    names = [row[0] for row in rows]
    assert names == [
        "<none>",
        "dummy",
        "dummy:v1",
        "huggingface.co/bartowski/llama-3.2-1b-instruct-gguf:Q4_K_M",
        "myorg/licensed",
    ]
    dummy = rows[1]
    assert dummy[1:5] == ["183", "Unknown", "llama", GOLDEN_ID[7:19]]
    assert dummy[-1] == "864B"
    shown = daemon.cli("show", "dummy").stdout
    assert "Tags:        docker.io/ai/dummy:latest, docker.io/ai/dummy:v1\n" in shown
    assert "Quantization: Unknown\n" in shown
