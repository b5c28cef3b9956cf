"""What Go's encoding/json accepts when DMR's CLI decodes our answers into its structs.

A schema maps each field the Go struct declares (by its JSON name) to the Go type it has there: Go skips
unknown fields and leaves missing ones at their zero value, but a present field of the wrong JSON type is
a decode error (`json: cannot unmarshal number into Go struct field ... of type string`). `go_decode`
raises AssertionError naming the field in that case, as DMR's CLI would fail.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

# Go types, by name: "string", "bool", "int", "float", "time" (time.Time, RFC 3339), "keepalive"
# (inference.KeepAlive: a string ParseKeepAlive accepts), "duration" (a Go duration string), or a nested
# schema (dict), or a one-element list [schema] for a slice, or ("map", type) for map[string]type.
Schema = Any

_GO_DURATION = re.compile(r"[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+|[-+]?0")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})")


def go_parse_duration_ok(text: str) -> bool:
    """time.ParseDuration's grammar."""
    return bool(_GO_DURATION.fullmatch(text))


def go_keep_alive_ok(text: str) -> bool:
    """inference.ParseKeepAlive (pkg/inference/backend.go): "0", "-1", or a Go duration."""
    return text in ("0", "-1") or go_parse_duration_ok(text)


def go_time(text: str) -> datetime:
    """time.Time.UnmarshalJSON: RFC 3339 (Go's own format, fractional seconds optional)."""
    assert _RFC3339.fullmatch(text), f"not an RFC 3339 time Go can read: {text!r}"
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def go_decode(value: Any, schema: Schema, where: str = "$") -> None:
    if value is None:
        return  # null leaves a Go value at its zero value
    if isinstance(schema, dict):
        assert isinstance(value, dict), f"{where}: Go wants an object, got {type(value).__name__}"
        for key, field_schema in schema.items():
            if key in value:
                go_decode(value[key], field_schema, f"{where}.{key}")
    elif isinstance(schema, list):
        assert isinstance(value, list), f"{where}: Go wants an array, got {type(value).__name__}"
        for i, item in enumerate(value):
            go_decode(item, schema[0], f"{where}[{i}]")
    elif isinstance(schema, tuple) and schema[0] == "map":
        assert isinstance(value, dict), f"{where}: Go wants an object (map), got {type(value).__name__}"
        for key, item in value.items():
            go_decode(item, schema[1], f"{where}[{key!r}]")
    elif schema == "string":
        assert isinstance(value, str), f"{where}: Go wants a string, got {value!r}"
    elif schema == "bool":
        assert isinstance(value, bool), f"{where}: Go wants a bool, got {value!r}"
    elif schema == "int":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: Go wants an integer"
    elif schema == "float":
        assert isinstance(value, int | float) and not isinstance(value, bool), f"{where}: Go wants a number"
    elif schema == "time":
        assert isinstance(value, str), f"{where}: Go's time.Time wants an RFC 3339 string, got {value!r}"
        go_time(value)
    elif schema == "keepalive":
        assert isinstance(value, str) and go_keep_alive_ok(value), f"{where}: not a KeepAlive: {value!r}"
    elif schema == "any":
        pass
    else:
        raise AssertionError(f"unknown schema {schema!r}")


# pkg/inference/scheduling/api.go: BackendStatus (also cmd/cli/desktop/desktop.go's copy of it)
BACKEND_STATUS = {
    "backend_name": "string",
    "model_name": "string",
    "mode": "string",
    "last_used": "time",
    "in_use": "bool",
    "loading": "bool",
    "keep_alive": "keepalive",
}
# pkg/inference/scheduling/api.go: DiskUsage, UnloadResponse
DISK_USAGE = {"models_disk_usage": "int", "default_backend_disk_usage": "int"}
UNLOAD_RESPONSE = {"unloaded_runners": "int"}
# pkg/inference/backend.go: BackendConfiguration, as ModelConfigEntry.Config
BACKEND_CONFIGURATION = {
    "context-size": "int",
    "runtime-flags": ["string"],
    "speculative": {"draft_model": "string", "num_tokens": "int", "min_acceptance_rate": "float"},
    "keep_alive": "keepalive",
    "vllm": {"hf-overrides": ("map", "any"), "gpu-memory-utilization": "float"},
    "llamacpp": {"reasoning-budget": "int"},
}
MODEL_CONFIG_ENTRY = {
    "Backend": "string",
    "Model": "string",
    "ModelID": "string",
    "Mode": "string",
    "Config": BACKEND_CONFIGURATION,
}
# cmd/cli/desktop/desktop.go: ServerVersionResponse; pkg/inference/models/api.go: Model (the fields the CLI
# reads directly; its config is decoded by the store's own types)
SERVER_VERSION = {"version": "string"}
# pkg/distribution/types/config.go: Config, what Model.UnmarshalJSON decodes `config` into
MODEL_CONFIG = {
    "format": "string",
    "quantization": "string",
    "parameters": "string",
    "architecture": "string",
    "size": "string",
    "gguf": ("map", "string"),
    "safetensors": ("map", "string"),
    "diffusers": ("map", "string"),
    "context_size": "int",
}
MODEL = {"id": "string", "tags": ["string"], "created": "int", "config": MODEL_CONFIG}
# pkg/distribution/oci/progress.go: ProgressMessage
PROGRESS_MESSAGE = {
    "type": "string",
    "message": "string",
    "total": "int",
    "layer": {"id": "string", "size": "int", "current": "int"},
    "mode": "string",
}
# pkg/distribution/distribution: DeleteModelResponse ([]{Untagged *string, Deleted *string})
DELETE_RESPONSE = [{"Untagged": "string", "Deleted": "string"}]
