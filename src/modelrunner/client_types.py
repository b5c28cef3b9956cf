"""The daemon's answers as the client returns them: typed views of the JSON the CLI reads.

Each keeps the document as the daemon sent it in `raw`, so what `--json` prints is the daemon's JSON byte
for byte, fields of a newer daemon included; the typed fields are what the CLI's tables read. A field the
daemon left out (a DMR daemon, an older one) reads as its zero value, as Go's decoder would. NamedTuples,
not dataclasses: those import `inspect`, which `model ls` would pay for at every start.
"""

from __future__ import annotations

from typing import Any, NamedTuple


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    """A JSON number as a whole number; 0 for anything else (null, text, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    try:
        return int(value)
    except (ValueError, OverflowError):
        return 0


class Model(NamedTuple):
    """One model of `GET /models` (DMR's Model)."""

    id: str
    tags: list[str]
    created: int  # unix seconds; 0 when unknown
    config: dict[str, Any]  # DMR's Config: format, quantization, parameters, architecture, size, ...
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Model:
        tags = doc.get("tags")
        return cls(
            id=str(doc.get("id") or ""),
            tags=[str(tag) for tag in tags] if isinstance(tags, list) else [],
            created=_int(doc.get("created")),
            config=_dict(doc.get("config")),
            raw=doc,
        )

    def with_tags(self, tags: list[str]) -> Model:
        """The model listed under only these tags (a filtered `ls`)."""
        return self._replace(tags=tags, raw={**self.raw, "tags": tags})


class Runner(NamedTuple):
    """One running engine of `GET /engines/ps` (DMR's BackendStatus, and our fields after it)."""

    model_name: str
    backend_name: str
    mode: str
    loading: bool
    in_use: bool
    keep_alive: str | int | float | None  # as the daemon wrote it ("5m", seconds, -1)
    last_used: str | int | None  # DMR: an RFC 3339 time; ours: unix seconds
    layout: dict[str, Any]  # ours: how a runner is spread beyond its process; {} when it is not
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Runner:
        return cls(
            model_name=str(doc.get("model_name") or ""),
            backend_name=str(doc.get("backend_name") or ""),
            mode=str(doc.get("mode") or ""),
            loading=bool(doc.get("loading")),
            in_use=bool(doc.get("in_use")),
            keep_alive=doc.get("keep_alive"),
            last_used=doc.get("last_used"),
            layout=_dict(doc.get("layout")),
            raw=doc,
        )


class DiskUsage(NamedTuple):
    """`GET /engines/df`: bytes the models and the default engine take."""

    models: int
    default_backend: int

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DiskUsage:
        return cls(_int(doc.get("models_disk_usage")), _int(doc.get("default_backend_disk_usage")))


def _str(value: Any) -> str:
    """A JSON string as it is; "" for null or a field left out (Go's zero value)."""
    return "" if value is None else str(value)


class Version(NamedTuple):
    """`GET /version` (DMR's and Ollama's shape)."""

    version: str
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Version:
        return cls(_str(doc.get("version")), doc)


class ModelConfiguration(NamedTuple):
    """One entry of `GET /engines/_configure` (DMR's `{Backend, Model, ModelID, Mode, Config}`)."""

    backend: str
    model: str  # the model's first tag
    model_id: str
    mode: str
    config: dict[str, Any]  # the engine's settings, as DMR's BackendConfiguration
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ModelConfiguration:
        return cls(
            backend=_str(doc.get("Backend")),
            model=_str(doc.get("Model")),
            model_id=_str(doc.get("ModelID")),
            mode=_str(doc.get("Mode")),
            config=_dict(doc.get("Config")),
            raw=doc,
        )


class EngineState(NamedTuple):
    """One engine of `GET /engines/info`."""

    status: str  # DMR's words, as `GET /engines/status` gives them ("Running: llama.cpp b11434")
    state: str
    version: str
    detail: str
    supported: bool  # whether it can run on the daemon's machine

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EngineState:
        return cls(
            status=_str(doc.get("status")),
            state=_str(doc.get("state")),
            version=_str(doc.get("version")),
            detail=_str(doc.get("detail")),
            supported=bool(doc.get("supported")),
        )


class EnginesInfo(NamedTuple):
    """`GET /engines/info` (ours): the engines' states, the platform, the accelerator found and the
    daemon's extra listen addresses (where containers reach it)."""

    platform: str
    accelerator: dict[str, Any]
    engines: dict[str, EngineState]
    extra_listen: list[str]
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EnginesInfo:
        listen = doc.get("extra_listen")
        return cls(
            platform=_str(doc.get("platform")),
            accelerator=_dict(doc.get("accelerator")),
            engines={str(k): EngineState.from_json(_dict(v)) for k, v in _dict(doc.get("engines")).items()},
            extra_listen=[str(a) for a in listen] if isinstance(listen, list) else [],
            raw=doc,
        )


class MemoryEstimate(NamedTuple):
    """`GET /engines/estimate` (ours): the memory one runner of the model needs on the daemon's machine."""

    model: str
    model_id: str
    backend: str
    memory_bytes: int

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> MemoryEstimate:
        return cls(
            model=_str(doc.get("model")),
            model_id=_str(doc.get("model_id")),
            backend=_str(doc.get("backend")),
            memory_bytes=_int(doc.get("memory_bytes")),
        )
