"""Output exactly as DMR's CLI prints it (`cmd/cli/commands/utils.go`, `formatter/json.go`), for the verbs
whose output scripts parse: tables as its tablewriter setup draws them, sizes as go-units' CustomSize (JSON as
Go's encoding/json writes it: artifact/gojson.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def go_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """DMR's `newTable`: no borders or separators, every cell left-aligned and padded to its column's width
    plus two spaces (the last column too), one line per row, each ending in a newline."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    return "".join(
        "".join(cell.ljust(width) + "  " for cell, width in zip(row, widths, strict=True)) + "\n"
        for row in [headers, *rows]
    )


_DECIMAL_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")


def custom_size(n_bytes: float) -> str:
    """go-units `CustomSize("%.2f%s", size, 1000.0, [B kB MB ...])`, as `docker model df` prints sizes."""
    size, unit = float(n_bytes), 0
    while size >= 1000 and unit < len(_DECIMAL_UNITS) - 1:
        size /= 1000
        unit += 1
    return f"{size:.2f}{_DECIMAL_UNITS[unit]}"


def standard_json(value: Any) -> str:
    """DMR's `formatter.ToStandardJSON`: four-space indent, HTML characters left as they are, and the
    trailing newline of json.Encoder."""
    return json.dumps(value, ensure_ascii=False, indent=4) + "\n"


# DMR's DMRMetadata (pkg/inference/models/api.go): every field `omitempty` (a nil pointer, an empty string)
_OMITTED_WHEN_EMPTY = ("context_window", "architecture", "parameters", "quantization", "size")


def openai_model_view(model: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI model object as DMR's CLI re-encodes it (its OpenAIModel struct): the `dmr` block without
    its empty fields (a null `context_window`), and left out when nothing remains."""
    dmr = model.get("dmr")
    if not isinstance(dmr, dict):
        return model
    kept = {k: v for k, v in dmr.items() if not (k in _OMITTED_WHEN_EMPTY and (v is None or v == ""))}
    view = {k: v for k, v in model.items() if k != "dmr"}
    if kept:
        view["dmr"] = kept
    return view
