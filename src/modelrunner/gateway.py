"""`model gateway`'s server: an OpenAI-compatible front that routes each model alias to configured providers
through LiteLLM's Router (load balancing across an alias's deployments, retries, fallbacks), configured as
DMR's gateway is (cmd/cli/docs/reference/model_gateway.md; its server, model-cli/src/*.rs): `model_list`
entries of `model_name` and `params` (LiteLLM's `litellm_params`), `general_settings` (master_key,
num_retries, fallbacks, request_timeout), `gateway_settings`, `environment_variables`.

LiteLLM is an optional extra (`modelrunner[gateway]`): it is imported only when a gateway starts, and
never fetches its cost map (LITELLM_LOCAL_MODEL_COST_MAP).
"""

from __future__ import annotations

import hmac
import json
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from modelrunner import __version__

INSTALL = "pip install 'modelrunner[gateway]'"

# Providers whose `api_base` DMR's gateway takes as an OpenAI-compatible base (with its /v1) while LiteLLM's
# provider of that name speaks another API or runs in-process: these go through LiteLLM's OpenAI-compatible
# client, at DMR's default base when none is given (model-cli/src/providers/mod.rs: build_api_url).
# `docker_model_runner` is the runner this CLI talks to (its base is given to load_config).
OPENAI_COMPATIBLE_BASES: dict[str, str | None] = {
    "docker_model_runner": None,
    "openai_like": None,
    "ollama": "http://localhost:11434/v1",
    "vllm": "http://localhost:8000/v1",
    "lm_studio": "http://localhost:1234/v1",
}

# Keys a client's request may not set: LiteLLM reads them as the call's configuration (where to send it,
# with which key), not as the provider's parameters.
CONTROL_KEYS = re.compile(
    r"^(api_base|base_url|api_key|api_version|custom_llm_provider|organization|headers|extra_headers"
    r"|timeout|max_retries|num_retries|fallbacks|mock_.*|metadata|litellm_.*|.*_api_key|aws_.*|vertex_.*)$"
)


class ConfigError(Exception):
    """The configuration file cannot be read or does not describe a gateway."""


class MissingLibrary(Exception):
    """LiteLLM is not installed."""


@dataclass
class Deployment:
    alias: str
    params: dict[str, Any]  # LiteLLM's litellm_params


@dataclass
class GatewayConfig:
    deployments: list[Deployment]
    master_key: str | None = None
    num_retries: int = 0
    fallbacks: list[dict[str, list[str]]] = field(default_factory=list)
    timeout: float | None = None
    drop_params: bool = False

    @property
    def aliases(self) -> list[str]:
        return sorted({deployment.alias for deployment in self.deployments})


def resolve_env(value: str) -> str:
    """`os.environ/VAR` and `${VAR}` as DMR's gateway reads them: an unset variable leaves the text as is."""
    if value.startswith("os.environ/"):
        return os.environ.get(value.removeprefix("os.environ/"), value)
    if value.startswith("${") and value.endswith("}"):
        return os.environ.get(value[2:-1], value)
    return value


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping")
    return value


def _number(settings: dict[str, Any], key: str, where: str) -> Any:
    value = settings.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
        raise ConfigError(f"{where}.{key} must be a non-negative number")
    return value


def _deployment(index: int, entry: Any, runner: tuple[str, str | None]) -> Deployment:
    where = f"model_list[{index}]"
    entry = _mapping(entry, where)
    alias, params = entry.get("model_name"), _mapping(entry.get("params"), f"{where}.params")
    if not isinstance(alias, str) or not alias:
        raise ConfigError(f"{where}.model_name is required")
    model = params.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{where}.params.model is required (<provider>/<model>)")
    out = {key: resolve_env(value) if isinstance(value, str) else value for key, value in params.items()}
    provider, _, upstream = model.partition("/")
    if not upstream:  # no provider: DMR's default, OpenAI
        provider, upstream = "openai", model
    if provider in OPENAI_COMPATIBLE_BASES:
        base = runner[0] if provider == "docker_model_runner" else OPENAI_COMPATIBLE_BASES[provider]
        out.setdefault("api_base", base)
        # local servers take no key, but the OpenAI client needs one: the runner's own when it has one
        out.setdefault("api_key", (runner[1] if provider == "docker_model_runner" else None) or "none")
        provider = "openai"
    out["model"] = f"{provider}/{upstream}"
    return Deployment(alias, out)


def load_config(path: Path, runner: tuple[str, str | None]) -> GatewayConfig:
    """Read a gateway configuration; `runner` is the OpenAI base and API key of `docker_model_runner/`."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    top = _mapping(raw, "the configuration")
    for key, value in _mapping(top.get("environment_variables"), "environment_variables").items():
        os.environ[str(key)] = resolve_env(str(value))
    entries = top.get("model_list") or []
    if not isinstance(entries, list):
        raise ConfigError("model_list must be a list")
    deployments = [_deployment(index, entry, runner) for index, entry in enumerate(entries)]
    general = _mapping(top.get("general_settings"), "general_settings")
    gateway = _mapping(top.get("gateway_settings"), "gateway_settings")
    master_key = general.get("master_key")
    if master_key is not None and not isinstance(master_key, str):
        raise ConfigError("general_settings.master_key must be a string")
    config = GatewayConfig(
        deployments,
        master_key=resolve_env(master_key) if master_key else None,
        num_retries=int(
            _number(general, "num_retries", "general_settings")
            or _number(gateway, "num_retries", "gateway_settings")
            or 0
        ),
        timeout=_number(general, "request_timeout", "general_settings")
        or _number(gateway, "request_timeout", "gateway_settings"),
        drop_params=bool(gateway.get("drop_params")),
    )
    known = set(config.aliases)
    for item in general.get("fallbacks") or []:
        for alias, targets in _mapping(item, "general_settings.fallbacks[]").items():
            if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
                raise ConfigError(f"the fallbacks of {alias} must be a list of model names")
            if unknown := [name for name in [alias, *targets] if name not in known]:
                raise ConfigError(f"fallbacks name models not in model_list: {', '.join(unknown)}")
            config.fallbacks.append({alias: targets})
    return config


def build_router(config: GatewayConfig, verbose: bool = False) -> Any:
    """LiteLLM's Router over the deployments (MissingLibrary when LiteLLM is not installed)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetched: offline, and reproducible
    if verbose:
        os.environ.setdefault("LITELLM_LOG", "DEBUG")
    try:
        import litellm
    except ImportError:
        raise MissingLibrary(f"model gateway needs LiteLLM: {INSTALL}") from None
    litellm.telemetry = False
    litellm.suppress_debug_info = True
    litellm.drop_params = config.drop_params
    return litellm.Router(
        model_list=[{"model_name": d.alias, "litellm_params": d.params} for d in config.deployments],
        num_retries=config.num_retries,
        fallbacks=config.fallbacks,
        timeout=config.timeout,
        routing_strategy="simple-shuffle",
    )


def error_body(kind: str, message: str) -> dict[str, Any]:
    """An error in OpenAI's shape, as DMR's gateway words it (model-cli/src/error.rs)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(error_body(kind, message), status_code=status)


def upstream_failure(exc: Exception) -> tuple[int, str]:
    """A provider's failure, after retries and fallbacks: its status, else 502 (unreachable) or 504."""
    import litellm

    if isinstance(exc, litellm.Timeout):
        status = 504
    elif isinstance(exc, litellm.APIConnectionError):
        status = 502
    else:
        code = getattr(exc, "status_code", None)
        status = code if isinstance(code, int) and 400 <= code < 600 else 502
    return status, str(getattr(exc, "message", None) or exc)


def dump(answer: Any) -> Any:
    return answer.model_dump(mode="json") if hasattr(answer, "model_dump") else answer


async def events(stream: Any) -> AsyncIterator[bytes]:
    """A LiteLLM stream as server-sent events; the provider's stream is closed however it ends (a client
    that leaves cancels this generator)."""
    try:
        async for chunk in stream:
            yield b"data: " + json.dumps(dump(chunk)).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    except Exception as exc:  # after the head: reported as an event, as DMR's gateway does
        body = error_body("server_error", upstream_failure(exc)[1])
        yield b"data: " + json.dumps(body).encode() + b"\n\n"
    finally:
        await stream.aclose()


def request_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """A client's body as the Router's arguments: LiteLLM's own control keys go to the provider's body
    (extra_body) rather than configure the call."""
    arguments = {key: value for key, value in body.items() if not CONTROL_KEYS.match(key)}
    extra = {key: value for key, value in body.items() if CONTROL_KEYS.match(key)}
    if extra:
        arguments["extra_body"] = {**(arguments.get("extra_body") or {}), **extra}
    return arguments


def create_app(config: GatewayConfig, router: Any) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    aliases = config.aliases
    headers = {"x-model-cli-version": __version__}

    def denied(request: Request) -> JSONResponse | None:
        """The master key, as a Bearer token or x-api-key (model-cli/src/auth.rs)."""
        if config.master_key is None:
            return None
        given = request.headers.get("authorization")
        given = given.removeprefix("Bearer ") if given is not None else request.headers.get("x-api-key", "")
        if hmac.compare_digest(given.encode(), config.master_key.encode()):
            return None
        return error(401, "authentication_error", "Invalid API key")

    @app.get("/")
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "healthy", "version": __version__, "models": aliases}

    @app.get("/v1/models")
    @app.get("/models")
    async def models(request: Request) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        now = int(time.time())
        data = [{"id": name, "object": "model", "created": now, "owned_by": "model-cli"} for name in aliases]
        return JSONResponse({"object": "list", "data": data})

    async def forward(request: Request, call: Callable[..., Awaitable[Any]], streams: bool) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        try:
            body = await request.json()
        except ValueError:
            return error(400, "invalid_request_error", "the request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return error(400, "invalid_request_error", "model is required")
        if body["model"] not in aliases:
            message = f"The model '{body['model']}' does not exist or you do not have access to it."
            return error(404, "invalid_request_error", message)
        stream = streams and body.get("stream") is True
        try:
            answer = await call(**request_arguments(body))
        except Exception as exc:
            status, message = upstream_failure(exc)
            return error(status, "upstream_error", message)
        if stream:
            sse = {**headers, "Cache-Control": "no-cache"}
            return StreamingResponse(events(answer), media_type="text/event-stream", headers=sse)
        return JSONResponse(dump(answer), headers=headers)

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward(request, router.acompletion, streams=True)

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(request: Request) -> Response:
        return await forward(request, router.atext_completion, streams=True)

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(request: Request) -> Response:
        return await forward(request, router.aembedding, streams=False)

    return app
