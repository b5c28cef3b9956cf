"""The one route table: which API family a path belongs to, which inference paths are relayed to an engine
as they are (and the engine path each reaches), and DMR's `/engines[/{backend}]` prefix rule.

The HTTP front (server/front.py) and the ASGI dispatcher (server/app.py) ask `match_route` which requests
the relay serves; the error shapes (server/errors.py), the access log and the request metrics
(server/lifecycle.py, server/request_metrics.py) and the recorder (server/recorder.py) ask `api_family`
and `family_of`; the routers register their paths from the prefixes here. A new API family is a line in
FAMILIES and its operations in OPERATIONS (or a root of its own, as Ollama's `/api/`), beside its router.

DMR's paths: an operation (`/v1/chat/completions`, `/rerank`, ...) is served below `/engines/{backend}`
and `/engines`, and at the root through DMR's aliases (`/v1/...`, `/rerank`, `/score` are
`/engines/v1/...`, ...: `alias_target`). A backend named `v1` is the API version, not a backend
(`/engines/v1/rerank` is `/engines` + `/v1/rerank`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from modelrunner.compat import assemble
from modelrunner.engines.base import Mode

# The API families: the shape of their errors (server/errors.py), the `api` of access lines and metrics.
OPENAI, OLLAMA, ANTHROPIC, RESPONSES, DMR = "openai", "ollama", "anthropic", "responses", "dmr"


@dataclass(frozen=True)
class Family:
    name: str
    streams_by_default: bool = False  # a request without `stream` is answered as a stream (Ollama's)
    origin: str = ""  # DMR's X-Request-Origin of its recorded generations (server/recorder.py)
    origin_paths: tuple[str, ...] | None = None  # the paths that are generations (None: all of them)


FAMILIES = {
    family.name: family
    for family in (
        Family(OPENAI),
        # DMR's origins are set by its Ollama and Anthropic handlers; the Responses API's is ours
        Family(OLLAMA, True, "ollama/completion", ("/api/chat", "/api/generate")),
        Family(ANTHROPIC, origin="anthropic/messages"),
        Family(RESPONSES, origin="openai/responses"),
        Family(DMR),
    )
}


@dataclass(frozen=True)
class Operation:
    family: str
    mode: Mode | None = None  # relayed to the engine as it is, by the front or the ASGI relay; None: a router
    engine_path: str | None = None  # the engine path it reaches (the same path for a relayed operation)
    subpaths: bool = False  # the paths below it are the family's too (`/v1/responses/{id}`)


COUNT_TOKENS = assemble.MESSAGES + "/count_tokens"  # Anthropic's token count (llama-server's own)


def _relayed(path: str, mode: Mode = Mode.COMPLETION) -> tuple[str, Operation]:
    return path, Operation(OPENAI, mode, path)


# Operations, as paths below `/engines[/{backend}]` and at the root.
OPERATIONS = dict(
    [
        _relayed(assemble.CHAT),
        _relayed(assemble.COMPLETIONS),
        _relayed("/v1/embeddings", Mode.EMBEDDING),
        _relayed("/v1/rerank", Mode.RERANKING),
        _relayed("/v1/score", Mode.RERANKING),
        _relayed("/rerank", Mode.RERANKING),
        _relayed("/score", Mode.RERANKING),
        _relayed("/v1/images/generations", Mode.IMAGE_GENERATION),
        ("/v1/models", Operation(OPENAI, subpaths=True)),
        (assemble.MESSAGES, Operation(ANTHROPIC, engine_path=assemble.MESSAGES)),
        (COUNT_TOKENS, Operation(ANTHROPIC, engine_path=COUNT_TOKENS)),
        ("/v1/responses", Operation(RESPONSES, engine_path=assemble.CHAT, subpaths=True)),
        ("/responses", Operation(RESPONSES, engine_path=assemble.CHAT, subpaths=True)),
    ]
)
# Operations below `/anthropic` (ours: the base URL of Anthropic's SDKs, whose `/v1/models` is Anthropic's).
ANTHROPIC_ROOT = "/anthropic"
ANTHROPIC_OPERATIONS = {
    assemble.MESSAGES: OPERATIONS[assemble.MESSAGES],
    COUNT_TOKENS: OPERATIONS[COUNT_TOKENS],
    "/v1/models": Operation(ANTHROPIC, subpaths=True),
}
OLLAMA_PREFIX = "/api"  # all of Ollama's API, below one root
OLLAMA_ROOT = OLLAMA_PREFIX + "/"

# Route prefixes the routers register (FastAPI path patterns).
ENGINES = "/engines"
ENGINES_V1 = ENGINES + "/v1"
BACKEND_V1 = ENGINES + "/{backend}/v1"
ANTHROPIC_V1 = ANTHROPIC_ROOT + "/v1"
_ALIASES = ("/v1/", "/rerank", "/score")  # DMR's root aliases of `/engines/...`


@dataclass(frozen=True, slots=True)
class Route:
    """An inference request relayed to its engine as it is."""

    backend: str | None  # the engine named in the path, if one was
    upstream_path: str  # the engine's path: /v1/..., /rerank or /score
    mode: Mode


@dataclass(frozen=True, slots=True)
class Resolved:
    family: str
    operation: Operation | None
    route: Route | None


def _readings(path: str) -> tuple[tuple[str | None, str], ...]:
    """(backend, operation path) readings of a path: below `/engines/{backend}` first, then `/engines`,
    or the path itself (the root's aliases)."""
    if not path.startswith(ENGINES + "/"):
        return ((None, path),)
    backend, slash, rest = path[len(ENGINES) + 1 :].partition("/")
    below = (None, path[len(ENGINES) :])
    return ((backend, "/" + rest), below) if slash and backend else (below,)


def _operation(table: dict[str, Operation], path: str) -> Operation | None:
    found = table.get(path)
    if found is not None:
        return found
    for key, operation in table.items():
        if operation.subpaths and path.startswith(key + "/"):
            return operation
    return None


@functools.lru_cache(maxsize=64)  # a few paths, each request; 64 heads' paths at most held
def resolve(path: str) -> Resolved:
    """What the table says of a path (once per path: the front, the lifecycle and the recorder ask)."""
    if path.startswith(OLLAMA_ROOT):
        return Resolved(OLLAMA, None, None)
    if path.startswith(ANTHROPIC_ROOT + "/"):
        operation = _operation(ANTHROPIC_OPERATIONS, path[len(ANTHROPIC_ROOT) :])
        return Resolved(ANTHROPIC, operation, None) if operation else Resolved(DMR, None, None)
    for backend, rest in _readings(path):
        operation = _operation(OPERATIONS, rest)
        if operation is None:
            continue
        route = None
        if operation.mode is not None:
            upstream = rest
            if backend == "v1":  # the API version: `/engines/v1/rerank` is `/engines` + `/v1/rerank`
                backend, upstream = None, "/v1" + rest
            route = Route(backend, upstream, operation.mode)
        return Resolved(operation.family, operation, route)
    return Resolved(DMR, None, None)


@functools.lru_cache(maxsize=64)  # as `resolve`, without its call: the front asks for every request head
def match_route(path: str) -> Route | None:
    """The relayed inference route of a path, if it is one."""
    return resolve(path).route


@functools.lru_cache(maxsize=64)  # as `resolve`, without its call: the lifecycle asks for every request
def api_family(path: str) -> str:
    """Which API a path belongs to, for its error shape, the access log, the metrics and the recorder."""
    return resolve(path).family


def family_of(path: str) -> Family:
    return FAMILIES[resolve(path).family]


def engine_path(path: str) -> str | None:
    """The engine path a request to `path` reaches, where the path alone says it."""
    resolved = resolve(path)
    if resolved.route is not None:
        return resolved.route.upstream_path
    return resolved.operation.engine_path if resolved.operation is not None else None


def alias_target(path: str) -> str | None:
    """DMR's root aliases: `/v1/...`, `/rerank` and `/score` are served as `/engines` + the path."""
    return ENGINES + path if path.startswith(_ALIASES) else None
