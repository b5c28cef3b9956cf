"""Model search on Docker Hub (the `ai/` namespace) and Hugging Face, as DMR's `cmd/cli/search` does it.

Docker Hub: its repository list API (MODEL_RUNNER_DOCKER_HUB_URL, default https://hub.docker.com), pages of
at most 100 by pull count, filtered here by name or description. Hugging Face: `/api/models` at HF_ENDPOINT,
the models llama.cpp or vLLM can run, by downloads. Each result's backend and size are then looked up (four
at a time): a Docker Hub model's manifest from the registry, a Hugging Face repository's file list; a lookup
that fails leaves "unknown" (and no size), as DMR does.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx

from modelrunner.artifact import mediatypes as mt
from modelrunner.artifact.filetypes import classify_file, weight_format
from modelrunner.artifact.gojson import go_quote
from modelrunner.artifact.manifest import Manifest, parse_manifest
from modelrunner.distribution.huggingface import hub_endpoint
from modelrunner.distribution.registry import RegistryClient
from modelrunner.engines.registry import EngineRegistry, default_registry
from modelrunner.errors import status_line
from modelrunner.reference import parse_reference

DOCKER_HUB = "Docker Hub"
HUGGING_FACE = "HuggingFace"
SOURCES = {
    "all": (DOCKER_HUB, HUGGING_FACE),
    "": (DOCKER_HUB, HUGGING_FACE),
    "dockerhub": (DOCKER_HUB,),
    "docker": (DOCKER_HUB,),
    "hub": (DOCKER_HUB,),
    "huggingface": (HUGGING_FACE,),
    "hf": (HUGGING_FACE,),
}
UNKNOWN = "unknown"
_RESOLVE_CONCURRENCY = 4
_TIMEOUT = 30.0  # DMR's http.Client timeout
_HF_SKIPPED_TAGS = {"gguf", "transformers", "pytorch", "safetensors", "license:apache-2.0"}


class SearchError(Exception):
    """A source that could not be searched; the text is DMR's."""


@dataclass
class SearchResult:
    """DMR's search.SearchResult; `to_json` keeps its Go field names (the struct has no json tags)."""

    name: str
    description: str
    downloads: int
    stars: int
    source: str
    official: bool
    updated_at: str
    backend: str = UNKNOWN
    size: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "Name": self.name,
            "Description": self.description,
            "Downloads": self.downloads,
            "Stars": self.stars,
            "Source": self.source,
            "Official": self.official,
            "UpdatedAt": self.updated_at,
            "Backend": self.backend,
            "Size": self.size,
        }


def unknown_source(text: str) -> str:
    return (
        f"unknown source {go_quote(text)}: valid options are 'all', 'dockerhub', 'docker', 'hub', "
        "'huggingface', 'hf'"
    )


def docker_hub_url() -> str:
    return (os.environ.get("MODEL_RUNNER_DOCKER_HUB_URL") or "https://hub.docker.com").rstrip("/")


def search(
    sources: tuple[str, ...], query: str, limit: int, warn: Callable[[str], None]
) -> list[SearchResult]:
    """Every source at once; a source that fails is a warning unless all fail (and nothing was found).
    Docker Hub's results first, each source's by downloads, then `limit` of them in all."""
    searchers = {DOCKER_HUB: _search_docker_hub, HUGGING_FACE: _search_hugging_face}
    with httpx.Client(timeout=_TIMEOUT, headers={"Accept": "application/json"}) as http:
        with ThreadPoolExecutor(len(sources)) as pool:
            futures = [(source, pool.submit(searchers[source], http, query, limit)) for source in sources]
        results: list[SearchResult] = []
        errors: list[str] = []
        for source, future in futures:
            try:
                results.extend(future.result())
            except SearchError as exc:
                errors.append(f"{source}: {exc}")
                warn(f"Warning: failed to search {source}: {exc}")
    if not results and errors:
        raise SearchError(f"all search sources failed: [{' '.join(errors)}]")
    results.sort(key=lambda r: (r.source != DOCKER_HUB, -r.downloads))
    return results[:limit] if limit > 0 else results


def _get(http: httpx.Client, url: str, site: str) -> Any:
    try:
        response = http.get(url)
    except httpx.HTTPError as exc:
        raise SearchError(f"fetching from {site}: {_go_transport_error(url, exc)}") from None
    if response.status_code == 429:
        raise SearchError(f"rate limited by {site}, please try again later")
    if response.status_code != 200:
        raise SearchError(f"unexpected status from {site}: {status_line(response.status_code)}")
    try:
        return response.json()
    except ValueError as exc:
        raise SearchError(f"decoding response: {exc}") from None


def _search_docker_hub(http: httpx.Client, query: str, limit: int) -> list[SearchResult]:
    limit = limit if limit > 0 else 32
    query = query.lower()
    params = urlencode({"ordering": "pull_count", "page_size": min(limit, 100)})
    url: str = f"{docker_hub_url()}/v2/repositories/ai/?{params}"
    results: list[SearchResult] = []
    while len(results) < limit:
        page = _get(http, url, DOCKER_HUB)
        for repo in page.get("results") or []:
            name, description = str(repo.get("name", "")), str(repo.get("description") or "")
            if repo.get("is_private"):
                continue
            if query and query not in name.lower() and query not in description.lower():
                continue
            namespace = str(repo.get("namespace", ""))
            results.append(
                SearchResult(
                    name=f"{namespace}/{name}",
                    description=_truncate(description, 50),
                    downloads=int(repo.get("pull_count") or 0),
                    stars=int(repo.get("star_count") or 0),
                    source=DOCKER_HUB,
                    official=namespace == "ai",
                    updated_at=str(repo.get("last_updated") or ""),
                )
            )
            if len(results) >= limit:
                break
        if not page.get("next") or len(results) >= limit:
            break
        url = str(page["next"])
    return _resolve_all(results, _registry_backend)


def _search_hugging_face(http: httpx.Client, query: str, limit: int) -> list[SearchResult]:
    limit = min(limit if limit > 0 else 32, 1000)
    params = {"apps": "vllm,llama.cpp", "direction": "-1", "limit": str(limit), "sort": "downloads"}
    if query:
        params["search"] = query
    models = _get(http, f"{hub_endpoint()}/api/models?{urlencode(sorted(params.items()))}", HUGGING_FACE)
    results = [
        SearchResult(
            name=str(model.get("modelId") or model.get("id") or ""),
            description=_truncate(
                _hf_description(model.get("tags") or [], model.get("pipeline_tag") or ""), 50
            ),
            downloads=int(model.get("downloads") or 0),
            stars=int(model.get("likes") or 0),
            source=HUGGING_FACE,
            official=False,
            updated_at=str(model.get("createdAt") or ""),
        )
        for model in models
        if not model.get("private")
    ]
    return _resolve_all(results, lambda result: _hugging_face_backend(http, result.name))


def _hf_description(tags: list[str], pipeline_tag: str) -> str:
    """generateDescription: the pipeline tag, then up to three parts with model-family or chat tags."""
    parts = [pipeline_tag] if pipeline_tag else []
    for tag in (str(t).lower() for t in tags):
        if tag in _HF_SKIPPED_TAGS:
            continue
        if tag.startswith(("llama", "mistral", "phi", "qwen")) or "instruct" in tag or "chat" in tag:
            parts.append(tag)
            if len(parts) >= 3:
                break
    return ", ".join(parts) if parts else "AI model"


def _resolve_all(
    results: list[SearchResult], resolve: Callable[[SearchResult], tuple[str, int]]
) -> list[SearchResult]:
    def one(result: SearchResult) -> None:
        try:
            backend, size = resolve(result)
        except Exception:
            return
        if backend:
            result.backend, result.size = backend, size

    if results:
        with ThreadPoolExecutor(_RESOLVE_CONCURRENCY) as pool:
            list(pool.map(one, results))
    return results


@functools.cache
def _engines() -> EngineRegistry:
    return EngineRegistry.of(default_registry())


def _backends(formats: Iterable[str]) -> str:
    """The engines that run models of these formats, as the registry picks one for a format asked of no
    backend in particular (safetensors: vLLM, as DMR's search says), in the registry's order."""
    engines = _engines()
    chosen = {engines.resolve(None, model_format).name for model_format in formats}
    names = [name for name in engines if name in chosen]
    return ", ".join(names) if names else UNKNOWN


def _registry_backend(result: SearchResult) -> tuple[str, int]:
    """The backend the model's weight layers need, and the layers' total size, from its manifest."""
    ref = parse_reference(result.name)
    with RegistryClient(ref.registry) as client:
        data, _ = client.get_manifest(ref.repository, ref.digest or ref.tag or "latest")
    return _manifest_backend(parse_manifest(data))


def _manifest_backend(manifest: Manifest) -> tuple[str, int]:
    formats = [
        mt.WEIGHT_FORMATS[layer.media_type]
        for layer in manifest.layers
        if layer.media_type in mt.WEIGHT_FORMATS
    ]
    return _backends(formats), sum(layer.size for layer in manifest.layers)


def _hugging_face_backend(http: httpx.Client, repo: str) -> tuple[str, int]:
    """The backends the repository's weight files need, and those files' total size (its `main` tree)."""
    response = http.get(f"{hub_endpoint()}/api/models/{repo}/tree/main", params={"recursive": "true"})
    response.raise_for_status()
    formats, size = [], 0
    for entry in response.json():
        found = (
            weight_format(classify_file(str(entry.get("path", "")))) if entry.get("type") == "file" else None
        )
        if found is not None:
            formats.append(found)
            size += int((entry.get("lfs") or {}).get("size") or entry.get("size") or 0)
    return _backends(formats), size


def _truncate(text: str, width: int) -> str:
    """truncateString: at most `width` bytes, the last three "..." when cut."""
    data = text.encode()
    if len(data) <= width:
        return text
    return data[: width - 3].decode(errors="replace") + "..."


def _go_transport_error(url: str, exc: httpx.HTTPError) -> str:
    """Go's *url.Error for a GET: `Get "URL": cause`, a refused connection as net.Dial words it."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if (
        isinstance(exc, httpx.ConnectError)
        and isinstance(cause, OSError)
        and cause.errno == errno.ECONNREFUSED
    ):
        host = httpx.URL(url).host
        port = httpx.URL(url).port or (443 if url.startswith("https:") else 80)
        return f'Get "{url}": dial tcp {host}:{port}: connect: connection refused'
    if isinstance(exc, httpx.TimeoutException):
        return f'Get "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
    return f'Get "{url}": {exc}'
