"""The route table (server/routes.py): each path's API family, the relayed routes and the engine paths they
reach, DMR's `/engines[/{backend}]` prefix and root aliases."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.routing import APIRoute

from modelrunner.engines.base import Mode
from modelrunner.server import routes
from modelrunner.server.app import build_daemon
from modelrunner.server.routes import ANTHROPIC, DMR, OLLAMA, OPENAI, RESPONSES, Route
from modelrunner.store.store import ModelStore


@pytest.mark.parametrize(
    ("path", "family"),
    [
        ("/api/chat", OLLAMA),
        ("/api/tags", OLLAMA),
        ("/api/blobs/sha256:ab", OLLAMA),
        ("/api", DMR),
        ("/v1/messages", ANTHROPIC),
        ("/engines/v1/messages/count_tokens", ANTHROPIC),
        ("/engines/llama.cpp/v1/messages", ANTHROPIC),
        ("/anthropic/v1/messages", ANTHROPIC),
        ("/anthropic/v1/models", ANTHROPIC),
        ("/anthropic/v1/models/ai/smollm2", ANTHROPIC),
        ("/anthropic/v1/chat/completions", DMR),
        ("/anthropic/responses", DMR),
        ("/responses", RESPONSES),
        ("/responses/resp_1/input_items", RESPONSES),
        ("/v1/responses", RESPONSES),
        ("/engines/responses", RESPONSES),
        ("/engines/v1/responses/resp_1", RESPONSES),
        ("/engines/vllm/v1/responses", RESPONSES),
        ("/engines/vllm/responses", RESPONSES),
        ("/v1/chat/completions", OPENAI),
        ("/engines/llama.cpp/v1/embeddings", OPENAI),
        ("/rerank", OPENAI),
        ("/engines/score", OPENAI),
        ("/v1/models", OPENAI),
        ("/engines/v1/models/ai/smollm2:latest", OPENAI),
        ("/engines/vllm/v1/models", OPENAI),
        ("/models", DMR),
        ("/engines/ps", DMR),
        ("/engines/llama.cpp/_configure", DMR),
        ("/v1/chat/completions/", DMR),
        ("/", DMR),
    ],
)
def test_each_path_has_its_family(path: str, family: str) -> None:
    assert routes.api_family(path) == family


def test_a_path_beside_the_model_listing_is_dmrs_not_found() -> None:
    """`/v1/modelsfoo` is no route: DMR's mux answers its text 404, not the listing's family."""
    assert routes.api_family("/engines/v1/modelsfoo") == DMR


def test_a_path_relayed_as_openai_is_openais_whatever_its_backend_is_called() -> None:
    assert routes.match_route("/engines/responses/v1/embeddings") == Route(
        "responses", "/v1/embeddings", Mode.EMBEDDING
    )
    assert routes.api_family("/engines/responses/v1/embeddings") == OPENAI


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/engines/v1/chat/completions", Route(None, "/v1/chat/completions", Mode.COMPLETION)),
        ("/v1/completions", Route(None, "/v1/completions", Mode.COMPLETION)),
        ("/engines/llama.cpp/v1/embeddings", Route("llama.cpp", "/v1/embeddings", Mode.EMBEDDING)),
        ("/engines/vllm/rerank", Route("vllm", "/rerank", Mode.RERANKING)),
        ("/score", Route(None, "/score", Mode.RERANKING)),
        ("/engines/v1/rerank", Route(None, "/v1/rerank", Mode.RERANKING)),  # v1 is the version
        ("/engines/rerank", Route(None, "/rerank", Mode.RERANKING)),
        (
            "/engines/diffusers/v1/images/generations",
            Route("diffusers", "/v1/images/generations", Mode.IMAGE_GENERATION),
        ),
    ],
)
def test_relayed_routes_reach_their_engine_path(path: str, route: Route) -> None:
    assert routes.match_route(path) == route
    assert routes.engine_path(path) == route.upstream_path


@pytest.mark.parametrize(
    "path",
    [
        "/v1/messages",  # Anthropic's router
        "/v1/responses",
        "/v1/models",
        "/api/chat",
        "/engines//v1/chat/completions",  # cleaned by the dispatcher first
        "/engines/v1/chat/completions/x",
        "/chat/completions",
        "/engines",
    ],
)
def test_other_paths_are_not_relayed(path: str) -> None:
    assert routes.match_route(path) is None


def test_engine_paths_of_the_routers_families() -> None:
    assert routes.engine_path("/anthropic/v1/messages") == "/v1/messages"
    assert routes.engine_path("/engines/vllm/v1/messages/count_tokens") == "/v1/messages/count_tokens"
    assert routes.engine_path("/v1/responses") == "/v1/chat/completions"
    assert routes.engine_path("/api/chat") is None  # Ollama's: the body says (compat/ollama.py)


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/v1/chat/completions", "/engines/v1/chat/completions"),
        ("/v1/models/ai/x", "/engines/v1/models/ai/x"),
        ("/rerank", "/engines/rerank"),
        ("/score", "/engines/score"),
        ("/responses", None),  # served at the root itself
        ("/models", None),
        ("/v1", None),
    ],
)
def test_root_aliases_are_served_below_engines(path: str, target: str | None) -> None:
    assert routes.alias_target(path) == target


def test_families_say_their_stream_default_and_recorded_origin() -> None:
    assert routes.family_of("/api/generate").streams_by_default
    assert not routes.family_of("/v1/chat/completions").streams_by_default
    assert routes.family_of("/api/chat").origin == "ollama/completion"
    assert routes.family_of("/v1/messages").origin == "anthropic/messages"
    assert routes.family_of("/v1/responses").origin == "openai/responses"
    assert routes.family_of("/v1/chat/completions").origin == ""


def test_every_relayed_operation_is_openais() -> None:
    relayed = [op for op in routes.OPERATIONS.values() if op.mode is not None]
    assert relayed and all(op.family == OPENAI and op.engine_path for op in relayed)


ROUTER_FAMILIES = {
    "modelrunner.server.openai_api": OPENAI,
    "modelrunner.server.anthropic_api": ANTHROPIC,
    "modelrunner.server.responses_api": RESPONSES,
    "modelrunner.server.ollama_api": OLLAMA,
    "modelrunner.server.ollama_create": OLLAMA,
}


def _concrete(path: str) -> str:
    """A path a request could have, for a route's pattern."""
    path = path.replace("{backend}", "llama.cpp")
    return re.sub(r"\{[^}:]+(:path)?\}", lambda m: "ai/m" if m.group(1) else "x1", path)


def test_every_route_the_daemon_registers_is_its_routers_family(tmp_path: Path) -> None:
    """The routers register their paths from the table's prefixes: each path's family, as errors, access
    lines and the recorder see it, is its router's (DMR's for every other router)."""
    daemon = build_daemon(ModelStore(tmp_path / "models"), engines={})
    api = daemon.asgi.app.app.api  # type: ignore[attr-defined]  # LifecycleMiddleware -> Security -> Dispatcher
    seen: set[str] = set()
    for included in api.routes:
        router = getattr(included, "original_router", None)
        for route in router.routes if router is not None else [included]:
            if not isinstance(route, APIRoute):
                continue
            module = route.endpoint.__module__
            path = _concrete(route.path)  # an APIRouter's prefix is in its routes' paths
            assert routes.api_family(path) == ROUTER_FAMILIES.get(module, DMR), (module, route.path)
            seen.add(module)
    assert set(ROUTER_FAMILIES) <= seen and len(seen) > len(ROUTER_FAMILIES)
