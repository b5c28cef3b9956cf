"""`model search` against local stand-ins of Docker Hub's repository list API and Hugging Face's model API,
serving those APIs' response shapes as DMR's own tests do (MODEL_RUNNER_DOCKER_HUB_URL and HF_ENDPOINT point
the CLI at them; the registry, for Docker Hub results' backends, is a closed port: "unknown", as DMR).

Follows: `cmd/cli/commands/search.go` (newSearchCmd, prettyPrintSearchResults, formatCount),
`cmd/cli/search/client.go` (AggregatedClient.Search, ParseSource), `dockerhub.go`, `huggingface.go`
(generateDescription), `backend_resolution.go`; fixtures from `dockerhub_test.go`
(newDockerHubSearchServer), `huggingface_test.go` (newHuggingFaceSearchServer) and
`pkg/distribution/huggingface/client_test.go` (the tree listing).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conformance.dmr_daemons import cli_env, run_cli
from tests.daemon import free_port

HUB_REPOS = [
    {
        "name": "stable-diffusion",
        "namespace": "ai",
        "description": "Image generation model, uses a base latent diffusion model plus a refiner.",
        "star_count": 3,
        "pull_count": 18900,
        "last_updated": "2026-01-26T11:32:37.220001Z",
        "is_private": False,
    },
    {
        "name": "smollm2",
        "namespace": "ai",
        "description": "Tiny LLM",
        "star_count": 12,
        "pull_count": 1_200_000,
        "last_updated": "2026-01-20T10:00:00Z",
        "is_private": False,
    },
    {"name": "secret", "namespace": "ai", "description": "", "is_private": True, "pull_count": 9},
]
HF_MODELS = [
    {
        "modelId": "stabilityai/stable-diffusion-xl-base-1.0",
        "likes": 42,
        "downloads": 1000,
        "tags": ["text-to-image"],
        "pipeline_tag": "text-to-image",
        "createdAt": "2026-01-26T11:32:37.220001Z",
    },
    {
        "modelId": "foo/bar",
        "likes": 1,
        "downloads": 2,
        "tags": ["transformers", "llama", "conversational-chat"],
        "pipeline_tag": "text-generation",
        "createdAt": "2026-01-26T11:32:37.220001Z",
    },
]
HF_TREES = {
    "foo/bar": [
        {"type": "file", "path": "bar-Q4_K_M.gguf", "size": 1_500_000_000},
        {"type": "file", "path": "config.json", "size": 100},
    ]
}


class _StandIn(BaseHTTPRequestHandler):
    queries: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        type(self).queries.append(self.path)
        body: Any
        if url.path == "/v2/repositories/ai/":
            query = parse_qs(url.query)
            assert query["ordering"] == ["pull_count"]
            repos = sorted(HUB_REPOS, key=lambda repo: -int(repo["pull_count"]))  # type: ignore[call-overload]
            size = int(query["page_size"][0])
            body = {"count": len(repos), "next": "", "previous": "", "results": repos[:size]}
        elif url.path == "/api/models":  # the Hub filters by `search` itself
            term = parse_qs(url.query).get("search", [""])[0]
            body = [model for model in HF_MODELS if term in str(model["modelId"])]
        elif url.path.startswith("/api/models/") and url.path.endswith("/tree/main"):
            repo = url.path.removeprefix("/api/models/").removesuffix("/tree/main")
            if repo not in HF_TREES:
                self.send_error(404)
                return
            body = HF_TREES[repo]
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    _StandIn.queries = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def _env(tmp_path: Path, hub: str, hf: str) -> dict[str, str]:
    return cli_env(
        tmp_path,
        MODEL_RUNNER_DOCKER_HUB_URL=hub,
        HF_ENDPOINT=hf,
        DEFAULT_REGISTRY=f"127.0.0.1:{free_port()}",
        MODEL_RUNNER_REGISTRY_MIRRORS="",
    )


def test_table_docker_hub_first_then_hugging_face_by_downloads(tmp_path: Path, stand_in: str) -> None:
    """search.go prettyPrintSearchResults; client.go Search's sort; hf.co/ before Hugging Face names."""
    result = run_cli(_env(tmp_path, stand_in, stand_in), "search")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DESCRIPTION", "BACKEND", "SIZE", "DOWNLOADS", "STARS", "SOURCE"]
    assert [line.split("  ")[0] for line in lines[1:]] == [
        "ai/smollm2",
        "ai/stable-diffusion",
        "hf.co/stabilityai/stable-diffusion-xl-base-1.0",
        "hf.co/foo/bar",
    ]
    assert "1.2M" in lines[1] and "Docker Hub" in lines[1]
    assert "Image generation model, uses a base latent diff..." in lines[2]  # truncated to 50
    assert "n/a" in lines[2] and "unknown" in lines[2]  # the registry could not be asked
    bar = lines[4]
    assert "text-generation, llama, conversational-chat" in bar and "llama.cpp" in bar and "1.50GB" in bar


def test_json_is_the_results_with_go_field_names(tmp_path: Path, stand_in: str) -> None:
    """search.go --json: formatter.ToStandardJSON of []SearchResult (no json tags: Go's field names)."""
    result = run_cli(_env(tmp_path, stand_in, stand_in), "search", "--json", "bar")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[\n    {\n")
    found = json.loads(result.stdout)
    assert found == [
        {
            "Name": "foo/bar",
            "Description": "text-generation, llama, conversational-chat",
            "Downloads": 2,
            "Stars": 1,
            "Source": "HuggingFace",
            "Official": False,
            "UpdatedAt": "2026-01-26T11:32:37.220001Z",
            "Backend": "llama.cpp",
            "Size": 1_500_000_000,
        }
    ]
    assert any("search=bar" in q for q in _StandIn.queries)  # HF filters on its side; Hub here


def test_limit_and_source(tmp_path: Path, stand_in: str) -> None:
    """--limit caps each source's query and the merged list; --source picks one (ParseSource's aliases)."""
    env = _env(tmp_path, stand_in, stand_in)
    limited = run_cli(env, "search", "-n", "1", "--json")
    assert [r["Name"] for r in json.loads(limited.stdout)] == ["ai/smollm2"]
    assert any("page_size=1" in q for q in _StandIn.queries)
    assert any("limit=1" in q and q.startswith("/api/models?") for q in _StandIn.queries)
    hf = run_cli(env, "search", "--source", "hf", "--json")
    assert {r["Source"] for r in json.loads(hf.stdout)} == {"HuggingFace"}
    hub = run_cli(env, "search", "--source=docker", "--json", "smol")
    assert [r["Name"] for r in json.loads(hub.stdout)] == ["ai/smollm2"]
    none = run_cli(env, "search", "--source=hub", "nothing-like-this")
    assert none.stdout == 'No models found matching "nothing-like-this"\n'
    bad = run_cli(env, "search", "--source", "gitlab")
    assert bad.returncode == 1
    assert bad.stderr == (
        'unknown source "gitlab": valid options are '
        "'all', 'dockerhub', 'docker', 'hub', 'huggingface', 'hf'\n"
    )
    two = run_cli(env, "search", "a", "b")
    assert (two.returncode, two.stderr) == (1, "accepts at most 1 arg(s), received 2\n")


def test_offline_every_source_refused(tmp_path: Path) -> None:
    """client.go: a warning per failed source, then "search failed: all search sources failed: [...]"
    (exit 1)."""
    closed = f"http://127.0.0.1:{free_port()}"
    result = run_cli(_env(tmp_path, closed, closed), "search", "--source", "hf")
    url = f"{closed}/api/models?apps=vllm%2Cllama.cpp&direction=-1&limit=32&sort=downloads"
    cause = f'fetching from HuggingFace: Get "{url}": dial tcp {closed[7:]}: connect: connection refused'
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"Warning: failed to search HuggingFace: {cause}\n"
        f"search failed: all search sources failed: [HuggingFace: {cause}]\n"
    )
    both = run_cli(_env(tmp_path, closed, closed), "search")
    assert both.returncode == 1
    assert both.stderr.count("Warning: failed to search") == 2
    assert "fetching from Docker Hub: Get " in both.stderr
