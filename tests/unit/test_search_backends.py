"""Which backend `model search` names for a result, and its size: from a Hugging Face repository's file
list or a Docker Hub model's manifest (DMR's `cmd/cli/search/backend_resolution.go`), each format's engine
as the registry picks it, in the registry's order."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.manifest import Descriptor, Manifest
from modelrunner.distribution import search

DIGEST = "sha256:" + "0" * 64


def _hub_tree(tree: list[dict[str, Any]]) -> httpx.Client:
    """A stand-in for the Hub's tree listing (`/api/models/<repo>/tree/main?recursive=true`)."""

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/models/org/repo/tree/main"
        assert request.url.params["recursive"] == "true"
        return httpx.Response(200, content=json.dumps(tree).encode())

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_hugging_face_every_weight_format_in_registry_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    tree = [
        {"type": "file", "path": "unet/model.dduf", "size": 7},
        {"type": "file", "path": "model-00001.safetensors", "size": 5, "lfs": {"size": 500}},
        {"type": "file", "path": "q4.GGUF", "size": 3},
        {"type": "file", "path": "config.json", "size": 100},
        {"type": "directory", "path": "folder.gguf", "size": 1_000},
    ]
    with _hub_tree(tree) as http:
        assert search._hugging_face_backend(http, "org/repo") == ("llama.cpp, vllm, diffusers", 510)


def test_hugging_face_without_weights_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    with _hub_tree([{"type": "file", "path": "README.md", "size": 9}]) as http:
        assert search._hugging_face_backend(http, "org/repo") == (search.UNKNOWN, 0)


def _layer(media_type: str, size: int) -> Descriptor:
    return Descriptor(media_type, DIGEST, size)


def test_manifest_weight_layers_name_the_backends_every_layer_counts_in_the_size() -> None:
    config = _layer(mt.CONFIG_V01, 50)
    layers = (_layer(mt.DDUF, 1), _layer(mt.LICENSE, 2), _layer(mt.SAFETENSORS, 4), _layer(mt.GGUF, 8))
    assert search._manifest_backend(Manifest(config, layers)) == ("llama.cpp, vllm, diffusers", 15)
    assert search._manifest_backend(Manifest(config, layers[2:3])) == ("vllm", 4)


def test_manifest_without_weight_layers_is_unknown() -> None:
    manifest = Manifest(_layer(mt.CONFIG_V01, 50), (_layer(mt.CNCF_WEIGHT_GGUF, 3),))
    assert search._manifest_backend(manifest) == (search.UNKNOWN, 3)
