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
