"""OpenCode's files that `model launch opencode --model M` writes, as DMR's `cmd/cli/commands/opencode.go`
does: the `dmr` provider and the model in ~/.config/opencode/opencode.json, the model first among the recent
ones in ~/.local/state/opencode/model.json (in $XDG_CONFIG_HOME and $XDG_STATE_HOME when set, where OpenCode
reads them). Whatever else the user keeps there is left as it is; the files
are written as Go re-encodes them (every object's keys sorted, two-space indent, no final newline)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROVIDER = "dmr"
MAX_RECENT_MODELS = 10


def _read_object(path: Path) -> dict[str, Any] | None:
    """The file's JSON object; None when it is missing or not one (DMR ignores what it cannot parse)."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write(path: Path, value: dict[str, Any]) -> None:
    from modelrunner.artifact.gojson import as_interface, dumps

    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path.write_bytes(
        dumps(as_interface(value), "  ")
    )  # in place, as os.WriteFile: a symlinked file stays one


def _xdg(variable: str, default: str) -> Path:
    """An XDG base folder as OpenCode finds it (xdg-basedir): the variable when set, else ~/`default`.
    DMR writes under ~ whatever the variable says, where OpenCode does not look when it is set."""
    value = os.environ.get(variable, "")
    return Path(value) if value else Path.home() / default


def config_path() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / "opencode" / "opencode.json"


def state_path() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state") / "opencode" / "model.json"


def write_config(runner_url: str, model: str) -> None:
    """writeOpenCodeConfig: the provider's base URL is the runner's OpenAI API (`/v1`)."""
    path = config_path()
    config = _read_object(path) or {}
    config["$schema"] = "https://opencode.ai/config.json"
    provider = config.get("provider")
    if not isinstance(provider, dict):
        provider = {}
    base_url = f"{runner_url}/v1"
    dmr = provider.get(PROVIDER)
    if not isinstance(dmr, dict):
        dmr = {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Docker Model Runner (local)",
            "options": {"baseURL": base_url},
        }
    elif isinstance(dmr.get("options"), dict):
        dmr["options"]["baseURL"] = base_url
    else:
        dmr["options"] = {"baseURL": base_url}
    models = dmr.get("models")
    if not isinstance(models, dict):
        models = {}
    models[model] = {"name": model, "_launch": True}
    dmr["models"] = models
    provider[PROVIDER] = dmr
    config["provider"] = provider
    _write(path, config)


def write_state(model: str) -> None:
    """writeOpenCodeState: the model first in `recent` (once), ten entries at most."""
    path = state_path()
    state: dict[str, Any] = {"recent": [], "favorite": [], "variant": {}}
    state.update(_read_object(path) or {})  # as json.Unmarshal into the map of defaults
    recent = state["recent"] if isinstance(state["recent"], list) else []
    kept = [
        entry
        for entry in recent
        if not (
            isinstance(entry, dict) and entry.get("providerID") == PROVIDER and entry.get("modelID") == model
        )
    ]
    state["recent"] = [{"providerID": PROVIDER, "modelID": model}, *kept][:MAX_RECENT_MODELS]
    _write(path, state)
