"""Ollama's API shapes and their translation to and from OpenAI chat completions (contract 2.2).

Pure functions and pydantic models: no I/O, so every mapping is unit-tested on its own.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from modelrunner.errors import BadRequest, InvalidReference
from modelrunner.reference import DEFAULT_NAMESPACE, DOCKER_HUB, parse_reference
from modelrunner.store.store import StoredModel

# Ollama option -> the OpenAI (or llama-server extension) field it becomes.
_OPTION_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "ignore_eos": "ignore_eos",  # not Ollama's, but llama-server's: exact token counts in tests
}

# Magic bytes of the image formats vision models take; anything else is sent as JPEG, as Ollama assumes.
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


class _Lenient(BaseModel):
    """Ollama ignores fields it does not know; so do we."""

    model_config = ConfigDict(extra="ignore")


class ToolCallFunction(_Lenient):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCall(_Lenient):
    function: ToolCallFunction


class Message(_Lenient):
    role: str = Field(min_length=1)
    content: str | None = ""
    images: list[str] | None = None
    thinking: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None


def _not_a_bool(value: Any) -> Any:
    """Ollama's Duration takes a number of seconds or a duration string; `true` is refused ("unsupported
    type"), where pydantic would read it as 1 (a second)."""
    if isinstance(value, bool):
        raise ValueError('keep_alive must be a duration such as "5m" or a number of seconds, not a boolean')
    return value


KeepAlive = Annotated[str | int | float | None, BeforeValidator(_not_a_bool)]


class _ModelRequest(_Lenient):
    model: str = ""
    name: str = ""  # older clients say `name`

    def model_name(self) -> str:
        name = (self.model or self.name).strip()
        if not name:
            raise BadRequest("model is required")
        return name


class _InferenceRequest(_ModelRequest):
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    stream: bool = True
    format: str | dict[str, Any] | None = None
    think: bool | str | None = None


class ChatRequest(_InferenceRequest):
    messages: list[Message] = Field(default_factory=list, max_length=10_000)
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(_InferenceRequest):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    images: list[str] | None = None
    raw: bool = False


class EmbedRequest(_ModelRequest):
    input: str | list[str] = Field(default_factory=list)
    truncate: bool | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    dimensions: int | None = Field(default=None, gt=0)


class EmbeddingsRequest(_ModelRequest):
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class PullRequest(_ModelRequest):
    insecure: bool = False
    stream: bool = True


class CopyRequest(_Lenient):
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


def now_text() -> str:
    """Ollama's `created_at`: RFC 3339 in UTC with fractional seconds."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def timestamp_text(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


# -- requests ------------------------------------------------------------------------------------


def sampling_fields(options: dict[str, Any] | None) -> dict[str, Any]:
    """Ollama `options` as OpenAI request fields; `num_ctx` is not one (it configures the runner)."""
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if value is None:
            continue
        if key in _OPTION_FIELDS:
            out[_OPTION_FIELDS[key]] = value
        elif key == "num_predict":
            if not isinstance(value, int) or isinstance(value, bool):
                raise BadRequest("options.num_predict must be an integer")
            if value > 0:  # -1 (until the end) and -2 (fill the context) are the engine's default
                out["max_tokens"] = value
        elif key == "stop":
            out["stop"] = [value] if isinstance(value, str) else list(value)
    return out


def stored_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """`/api/create`'s `parameters` but `num_ctx` (the model's context size): the request options a model
    keeps as its defaults, those `sampling_fields` reads; a BadRequest names any other."""
    kept = {key: value for key, value in parameters.items() if key != "num_ctx" and value is not None}
    for key in kept:
        if key not in _OPTION_FIELDS and key not in ("num_predict", "stop"):
            raise BadRequest(f"parameter {key[:40]!r} cannot be stored with the model: send it per request")
    sampling_fields(kept)  # their values are checked as a request's
    return kept


_Request = TypeVar("_Request", "ChatRequest", "GenerateRequest")


def with_persona(request: _Request, system: str | None, parameters: dict[str, Any]) -> _Request:
    """A request to a model created with a system prompt and parameters, as Ollama applies them: the
    request's options win over the model's; the model's system prompt comes first unless the chat starts
    with a system message of its own (a generate request: unless it gives `system`; a raw one: never)."""
    changes: dict[str, Any] = {"options": {**parameters, **(request.options or {})}}
    if system and isinstance(request, ChatRequest):
        if not request.messages or request.messages[0].role != "system":
            changes["messages"] = [Message(role="system", content=system), *request.messages]
    elif system and isinstance(request, GenerateRequest) and not request.system and not request.raw:
        changes["system"] = system
    return request.model_copy(update=changes)


def context_size_option(options: dict[str, Any] | None) -> int | None:
    value = (options or {}).get("num_ctx")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value > 2**31 - 1:
        raise BadRequest("options.num_ctx must be a positive number of tokens")
    return value


def image_data_uri(image: str) -> str:
    """Ollama sends raw base64; OpenAI engines take data URIs, so the MIME type is sniffed."""
    if image.startswith("data:"):
        return image
    try:
        head = base64.b64decode(image[:64] + "=" * (-len(image[:64]) % 4), validate=False)
    except (binascii.Error, ValueError):
        raise BadRequest("images must be base64-encoded") from None
    mime = "image/jpeg"
    for magic, kind in _IMAGE_MAGIC:
        if head.startswith(magic):
            mime = kind
            break
    else:
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            mime = "image/webp"
    return f"data:{mime};base64,{image}"


def _content(text: str, images: list[str] | None) -> str | list[dict[str, Any]]:
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts += [{"type": "image_url", "image_url": {"url": image_data_uri(i)}} for i in images]
    return parts


def _arguments_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Ollama messages as OpenAI messages. Ollama's tool calls have no ids: we number them, and a tool
    result answers the pending call of the same name (or the oldest pending one)."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, function name) not answered yet
    counter = 0
    for message in messages:
        item: dict[str, Any] = {
            "role": message.role,
            "content": _content(message.content or "", message.images),
        }
        if message.thinking and message.role == "assistant":
            item["reasoning_content"] = message.thinking
        if message.tool_calls:
            calls = []
            for call in message.tool_calls:
                counter += 1
                call_id = f"call_{counter}"
                pending.append((call_id, call.function.name))
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": _arguments_text(call.function.arguments),
                        },
                    }
                )
            item["tool_calls"] = calls
        if message.role == "tool" and pending:
            match = next((p for p in pending if p[1] == message.tool_name), pending[0])
            pending.remove(match)
            item["tool_call_id"] = match[0]
        out.append(item)
    return out


def _response_format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    raise BadRequest(f'invalid format {str(fmt)[:40]!r}: use "json" or a JSON schema')


def _common_fields(request: _InferenceRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": request.model_name(), **sampling_fields(request.options)}
    response_format = _response_format(request.format)
    if response_format:
        body["response_format"] = response_format
    if request.think is not None:
        # Per request, through the chat template (llama-server and vLLM honour it): no reload needed.
        enabled = request.think if isinstance(request.think, bool) else request.think != "none"
        body["chat_template_kwargs"] = {"enable_thinking": enabled}
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def chat_body(request: ChatRequest) -> dict[str, Any]:
    body = _common_fields(request)
    body["messages"] = chat_messages(request.messages)
    if request.tools:
        body["tools"] = request.tools
    return body


def generate_body(request: GenerateRequest) -> tuple[str, dict[str, Any]]:
    """(engine path, body): a raw prompt is a plain completion, anything else a chat turn."""
    body = _common_fields(request)
    if request.raw:
        body.pop("chat_template_kwargs", None)
        body["prompt"] = request.prompt
        if request.suffix:
            body["suffix"] = request.suffix
        return "/v1/completions", body
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages.append({"role": "user", "content": _content(request.prompt, request.images)})
    body["messages"] = messages
    return "/v1/chat/completions", body


def embed_inputs(request: EmbedRequest) -> list[str]:
    inputs = [request.input] if isinstance(request.input, str) else request.input
    if not inputs:
        raise BadRequest("input is required")
    return inputs


# -- answers -------------------------------------------------------------------------------------


def ollama_tool_calls(calls: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """OpenAI tool calls (arguments as a JSON string) as Ollama's (arguments as an object)."""
    out = []
    for call in calls or []:
        function = call.get("function") or {}
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            arguments = {}
        out.append(
            {
                "function": {
                    "name": function.get("name", ""),
                    "arguments": arguments if isinstance(arguments, dict) else {},
                }
            }
        )
    return out


class ToolCallAccumulator:
    """OpenAI streams a tool call as pieces by index; Ollama sends each call whole."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, Any]] = {}

    def add(self, deltas: list[dict[str, Any]] | None) -> None:
        for delta in deltas or []:
            index = delta.get("index", len(self.calls))
            call = self.calls.setdefault(index, {"function": {"name": "", "arguments": ""}})
            function = delta.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    def take(self) -> list[dict[str, Any]]:
        calls = [self.calls[i] for i in sorted(self.calls)]
        self.calls.clear()
        return ollama_tool_calls(calls)


def done_reason(finish_reason: str | None) -> str:
    return "length" if finish_reason == "length" else "stop"


def final_fields(
    usage: dict[str, Any] | None, timings: dict[str, Any] | None, started: float, load_seconds: float
) -> dict[str, Any]:
    """The counts and durations (nanoseconds) of Ollama's last object, from the engine's usage."""
    usage = usage or {}
    timings = timings or {}
    return {
        "total_duration": int((time.monotonic() - started) * 1e9),
        "load_duration": int(load_seconds * 1e9),
        "prompt_eval_count": int(usage.get("prompt_tokens") or 0),
        "prompt_eval_duration": int(float(timings.get("prompt_ms") or 0) * 1e6),
        "eval_count": int(usage.get("completion_tokens") or 0),
        "eval_duration": int(float(timings.get("predicted_ms") or 0) * 1e6),
    }


# -- models --------------------------------------------------------------------------------------


def ollama_name(reference: str) -> str:
    """A stored name as Ollama clients write it: Ollama's default registry and namespace (`library/`) are
    left out, and so are ours (Docker Hub, `ai/`), so `ai/gemma3:270m` is listed as `gemma3:270m`, the
    name clients such as LangChain look for. Derived from the parsed reference, whichever form the store
    keeps (`index.docker.io/ai/x:t`, `docker.io/ai/x:t`); other registries and namespaces stay."""
    try:
        ref = parse_reference(reference)
    except InvalidReference:
        return reference
    name = ref.original_repository if ref.is_huggingface else ref.repository
    if ref.registry == DOCKER_HUB:
        name = name.removeprefix(f"{DEFAULT_NAMESPACE}/")
    else:
        name = f"{'hf.co' if ref.is_huggingface else ref.registry}/{name}"  # Ollama's spelling of HF
    if ref.tag is not None:
        name += f":{ref.tag}"
    if ref.digest is not None:
        name += f"@{ref.digest}"
    return name


def model_name(model: StoredModel) -> str:
    return ollama_name(model.tags[0]) if model.tags else model.id


def model_details(model: StoredModel) -> dict[str, Any]:
    config = model.config.config
    family = str(config.get("architecture") or "")
    return {
        "parent_model": "",
        "format": model.config.format,
        "family": family,
        "families": [family] if family else None,
        "parameter_size": str(config.get("parameters") or ""),
        "quantization_level": str(config.get("quantization") or ""),
    }


def model_size(model: StoredModel) -> int:
    return sum(layer.size for layer in model.manifest.layers)


def tags_entry(model: StoredModel, name: str | None = None) -> dict[str, Any]:
    name = name or model_name(model)
    return {
        "name": name,
        "model": name,
        "modified_at": timestamp_text(model.config.created),
        "size": model_size(model),
        "digest": model.id.removeprefix("sha256:"),
        "details": model_details(model),
    }


def parameters_text(parameters: dict[str, Any]) -> str:
    """Ollama's `/api/show` `parameters`: a line per value (a list's values each on its own), the name
    padded to 30 columns, the value as Go's %#v writes it."""
    lines = []
    for key, value in parameters.items():
        for one in value if isinstance(value, list) else [value]:
            lines.append(f"{key:<30} {json.dumps(one)}")
    return "\n".join(lines)


def show_response(
    model: StoredModel, system: str | None = None, parameters: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`system` and `parameters`: what `/api/create` kept with the model's tag."""
    config = model.config.config
    metadata = config.get("gguf") if isinstance(config.get("gguf"), dict) else {}
    assert isinstance(metadata, dict)
    info: dict[str, Any] = {k: v for k, v in metadata.items() if not k.startswith("tokenizer.")}
    if model.config.context_size is not None:
        info.setdefault("context_length", model.config.context_size)
    modelfile = f"# Modelfile generated by modelrunner\nFROM {model_name(model)}\n"
    if system:
        modelfile += f'SYSTEM """{system}"""\n'
    shown_parameters = parameters_text(parameters or {})
    modelfile += "".join(f"PARAMETER {line}\n" for line in shown_parameters.splitlines())
    return {
        "license": str(metadata.get("general.license") or ""),
        "modelfile": modelfile,
        "parameters": shown_parameters,
        **({"system": system} if system else {}),
        "template": str(metadata.get("tokenizer.chat_template") or ""),
        "details": model_details(model),
        "model_info": info,
        "capabilities": ["completion"] + (["embedding"] if model.config.format == "gguf" else []),
        "modified_at": timestamp_text(model.config.created),
    }


def progress_status(event: dict[str, Any]) -> dict[str, Any]:
    """One DMR progress event (contract 2.3) as an Ollama pull/push status line."""
    kind = event.get("type")
    if kind == "success":
        return {"status": "success"}
    if kind == "error":
        return {"error": str(event.get("message") or "failed")}
    layer = event.get("layer") or {}
    digest = layer.get("id")
    if digest:
        verb = "pulling" if event.get("mode") != "push" else "pushing"
        return {
            "status": f"{verb} {str(digest).removeprefix('sha256:')[:12]}",
            "digest": digest,
            "total": int(layer.get("size") or 0),
            "completed": int(layer.get("current") or 0),
        }
    return {"status": str(event.get("message") or "").lower()}
