"""Model names as DMR normalises and matches them.

* pkg/distribution/distribution/normalize_test.go (TestNormalizeModelName) gives normalizeModelName's
  results; the store then parses them with oci/reference.ParseReference (registry.GetDefaultRegistryOptions:
  default org `ai`, Docker Hub as `docker.io`), which is the stored tag. Each case below is upstream's
  input and its result, followed to the stored form.
* pkg/distribution/internal/store/index_test.go (TestMatchReference) gives IndexEntry.MatchesReference.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelrunner.errors import InvalidReference, ModelNotFound
from modelrunner.reference import parse_model_id, parse_reference
from modelrunner.store.store import ModelStore
from tests.conformance.dmr_layout import golden_dummy, write_dmr_store


@pytest.fixture(autouse=True)
def _docker_hub_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEFAULT_REGISTRY", raising=False)


# (upstream input, normalizeModelName's result in normalize_test.go, the stored tag)
NORMALIZE = [
    ("gemma3", "ai/gemma3:latest", "docker.io/ai/gemma3:latest"),
    ("gemma3:v1", "ai/gemma3:v1", "docker.io/ai/gemma3:v1"),
    ("myorg/model", "myorg/model:latest", "docker.io/myorg/model:latest"),
    ("myorg/model:v2", "myorg/model:v2", "docker.io/myorg/model:v2"),
    ("ai/gemma3:latest", "ai/gemma3:latest", "docker.io/ai/gemma3:latest"),
    ("registry.example.com/model", "registry.example.com/model:latest", "registry.example.com/model:latest"),
    ("registry.example.com/model:v1", "registry.example.com/model:v1", "registry.example.com/model:v1"),
    (
        "registry.example.com/myorg/model:v1",
        "registry.example.com/myorg/model:v1",
        "registry.example.com/myorg/model:v1",
    ),
    ("  gemma3  ", "ai/gemma3:latest", "docker.io/ai/gemma3:latest"),
    ("model:", "ai/model:latest", "docker.io/ai/model:latest"),
    ("myorg/model:", "myorg/model:latest", "docker.io/myorg/model:latest"),
    ("abc123", "ai/abc123:latest", "docker.io/ai/abc123:latest"),
    ("model-xyz", "ai/model-xyz:latest", "docker.io/ai/model-xyz:latest"),
    ("MyModel", "ai/mymodel:latest", "docker.io/ai/mymodel:latest"),
    ("hf.co/org/model", "huggingface.co/org/model:latest", "huggingface.co/org/model:latest"),
    ("hf.co/org/model:Q4_K_M", "huggingface.co/org/model:Q4_K_M", "huggingface.co/org/model:Q4_K_M"),
    ("huggingface.co/org/model", "huggingface.co/org/model:latest", "huggingface.co/org/model:latest"),
    (
        "huggingface.co/org/model:Q4_K_M",
        "huggingface.co/org/model:Q4_K_M",
        "huggingface.co/org/model:Q4_K_M",
    ),
]


@pytest.mark.parametrize(("given", "normalized", "stored"), NORMALIZE)
def test_names_normalise_as_dmr_stores_them(given: str, normalized: str, stored: str) -> None:
    assert str(parse_reference(given)) == stored
    assert str(parse_reference(normalized)) == stored  # normalising twice changes nothing


@pytest.mark.parametrize(
    "given",
    [
        "1234567890ab",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ],
)
def test_ids_are_ids_not_names(given: str) -> None:
    # normalize_test.go: short IDs, full hex and digests are resolved as IDs (looksLikeID/Digest)
    assert parse_model_id(given) is not None


@pytest.mark.parametrize("given", ["", "   "])
def test_empty_names_are_refused(given: str) -> None:
    # normalizeModelName returns "" and nothing matches it; here that is a clear 400
    with pytest.raises(InvalidReference):
        parse_reference(given)


def test_default_registry_replaces_docker_hub_for_short_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # oci/reference/reference.go: WithDefaultRegistry applies where no registry is explicit
    monkeypatch.setenv("DEFAULT_REGISTRY", "registry.local:5000")
    assert str(parse_reference("gemma3")) == "registry.local:5000/ai/gemma3:latest"
    assert str(parse_reference("docker.io/ai/gemma3")) == "docker.io/ai/gemma3:latest"


@pytest.mark.parametrize(
    ("reference", "matches"),
    [
        ("exact tag", True),
        ("implicit tag", True),
        ("implicit registry", True),
        ("mismatch tag reference", False),
        ("digest reference", True),
    ],
)
def test_match_reference_on_legacy_short_tags(tmp_path: Path, reference: str, matches: bool) -> None:
    # follows internal/store/index_test.go: TestMatchReference, entry tags "some-repo:latest" and
    # "some-repo:some-tag" as an early DMR stored them; compared by parsed reference
    model = golden_dummy(["some-repo:latest", "some-repo:some-tag"])
    root = tmp_path / "models"
    write_dmr_store(root, [model])
    (root / ".modelrunner-tags-v2").write_text("")  # keep the raw tags: test matching, not migration
    text = {
        "exact tag": "some-repo:some-tag",
        "implicit tag": "some-repo",
        "implicit registry": "docker.io/ai/some-repo:latest",
        "mismatch tag reference": "docker.io/some-org/some-repo:some-tag",
        "digest reference": f"docker.io/some-org/some-repo@{model.id}",
    }[reference]
    store = ModelStore(root)
    assert json.loads((root / "models.json").read_text())["models"][0]["tags"] == model.tags
    if matches:
        assert store.get(text).id == model.id
    else:
        with pytest.raises(ModelNotFound):
            store.get(text)
    assert store.get(model.id).id == model.id  # "ID match"
