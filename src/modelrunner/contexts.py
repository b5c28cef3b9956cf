"""Named model runner endpoints (`model context`), stored where DMR's CLI stores them, in its format:
`<docker config dir>/model/contexts.json`, changed under an exclusive lock on `contexts.lock` next to it
(`cmd/cli/pkg/modelctx/store.go`), so both CLIs share one list and one active context.

    {"version": 1, "current": "lab", "contexts": {"lab": {"host": "http://10.0.0.5:12434",
     "tls": {"enabled": false}, "description": "...", "createdAt": "2026-07-22T10:11:12Z"}}}

Ours adds an optional `apiKey` to a context (a daemon beyond loopback requires one). DMR's reader decodes
with Go's encoding/json, which skips unknown fields, so the file stays readable to it; DMR's writer drops
the field when DMR's CLI changes the file. Every field we do not know is kept when we rewrite the file, and
the file is written 0600 (it may hold a key), temp -> fsync -> rename.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from modelrunner.errors import BadRequest, ModelNotFound

DEFAULT_CONTEXT = "default"
FILE_VERSION = 1
_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")


def docker_config_dir() -> Path:
    """The Docker CLI's configuration folder: DOCKER_CONFIG, else ~/.docker."""
    explicit = os.environ.get("DOCKER_CONFIG")
    return Path(explicit).expanduser() if explicit else Path.home() / ".docker"


class Context(NamedTuple):
    """A named endpoint. (A named tuple, not a dataclass: every CLI command reads the active context, and
    importing dataclasses costs more than the rest of that.)"""

    name: str
    host: str
    tls: bool = False
    tls_skip_verify: bool = False
    tls_ca_cert: str = ""
    description: str = ""
    created_at: str = ""
    api_key: str | None = None

    @classmethod
    def from_json(cls, name: str, raw: Any) -> Context:
        if not isinstance(raw, dict) or not isinstance(raw.get("host"), str):
            raise BadRequest(f"context {name!r} in the context file has no host")
        found = raw.get("tls")
        tls: dict[str, Any] = found if isinstance(found, dict) else {}
        key = raw.get("apiKey")
        return cls(
            name=name,
            host=raw["host"],
            tls=tls.get("enabled") is True,
            tls_skip_verify=tls.get("skipVerify") is True,
            tls_ca_cert=str(tls.get("caCert") or ""),
            description=str(raw.get("description") or ""),
            created_at=str(raw.get("createdAt") or ""),
            api_key=key if isinstance(key, str) and key else None,
        )

    def to_json(self) -> dict[str, Any]:
        """DMR's ContextConfig (its field names and order; empty optional fields left out), plus apiKey."""
        tls: dict[str, Any] = {"enabled": self.tls}
        if self.tls_skip_verify:
            tls["skipVerify"] = True
        if self.tls_ca_cert:
            tls["caCert"] = self.tls_ca_cert
        out: dict[str, Any] = {"host": self.host, "tls": tls}
        if self.description:
            out["description"] = self.description
        out["createdAt"] = self.created_at or go_now()
        if self.api_key:
            out["apiKey"] = self.api_key
        return out


def go_now() -> str:
    """Now, as Go writes a UTC time.Time."""
    from datetime import UTC, datetime

    from modelrunner.artifact import gojson

    return gojson.time_text(datetime.now(UTC))


def validate_name(name: str) -> None:
    if name == DEFAULT_CONTEXT:
        raise BadRequest(f'context name "{DEFAULT_CONTEXT}" is reserved')
    if not _NAME.fullmatch(name):
        raise BadRequest(f"invalid context name {name!r}: must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


class ContextStore:
    def __init__(self, config_dir: Path | None = None) -> None:
        folder = (config_dir or docker_config_dir()) / "model"
        self.path = folder / "contexts.json"
        self.lock_path = folder / "contexts.lock"

    def _read(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {"version": FILE_VERSION, "contexts": {}}
        except (OSError, ValueError) as exc:
            raise BadRequest(f"unable to read the context file {self.path}: {exc}") from None
        if not isinstance(doc, dict):
            raise BadRequest(f"the context file {self.path} is not a JSON object")
        if not isinstance(doc.get("contexts"), dict):
            doc["contexts"] = {}
        return doc

    def list(self) -> dict[str, Context]:
        return {name: Context.from_json(name, raw) for name, raw in sorted(self._read()["contexts"].items())}

    def get(self, name: str) -> Context:
        raw = self._read()["contexts"].get(name)
        if raw is None:
            raise ModelNotFound(f"context {name!r} not found")
        return Context.from_json(name, raw)

    def active(self) -> str:
        current = self._read().get("current")
        return current if isinstance(current, str) and current else DEFAULT_CONTEXT

    def create(self, context: Context) -> None:
        validate_name(context.name)

        def add(doc: dict[str, Any]) -> None:
            if context.name in doc["contexts"]:
                raise BadRequest(f"context {context.name!r} already exists")
            doc["contexts"][context.name] = context.to_json()

        self._update(add)

    def remove(self, name: str) -> None:
        if name == DEFAULT_CONTEXT:
            raise BadRequest(f'context name "{DEFAULT_CONTEXT}" is reserved and cannot be removed')

        from modelrunner.artifact.gojson import go_quote  # Go's %q, as DMR's store.go words these

        def drop(doc: dict[str, Any]) -> None:
            if name not in doc["contexts"]:
                raise ModelNotFound(f"context {go_quote(name)} not found")
            if doc.get("current") == name:
                raise BadRequest(
                    f"context {go_quote(name)} is currently active; switch to another context first"
                )
            del doc["contexts"][name]

        self._update(drop)

    def use(self, name: str) -> None:
        if name != DEFAULT_CONTEXT:
            validate_name(name)

        def switch(doc: dict[str, Any]) -> None:
            if name == DEFAULT_CONTEXT:
                doc.pop("current", None)
            elif name not in doc["contexts"]:
                raise ModelNotFound(f"context {name!r} not found")
            else:
                doc["current"] = name

        self._update(switch)

    def _update(self, mutate: Callable[[dict[str, Any]], None]) -> None:
        from modelrunner.fileio import write_file_atomic  # not on every verb's start (the CLI reads only)

        with self._locked():
            doc = self._read()
            mutate(doc)
            ordered = {"version": doc.get("version", FILE_VERSION)}
            if doc.get("current"):
                ordered["current"] = doc["current"]
            ordered["contexts"] = dict(sorted(doc["contexts"].items()))
            ordered.update({k: v for k, v in doc.items() if k not in ("version", "current", "contexts")})
            data = (json.dumps(ordered, indent=4, ensure_ascii=False) + "\n").encode()
            write_file_atomic(self.path, data, mode=0o600)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock
