"""Golden transcripts of streamed answers: the structure of a stream, never its (random) text.

A golden file holds the event kinds in order, with runs of the same kind collapsed into one (how many
deltas a tiny model's random bytes make varies), and the keys the final events must carry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).parent


def collapse(kinds: list[str]) -> list[str]:
    out: list[str] = []
    for kind in kinds:
        if not out or out[-1] != kind:
            out.append(kind)
    return out


def load(name: str) -> dict[str, Any]:
    golden: dict[str, Any] = json.loads((FOLDER / f"{name}.json").read_text())
    return golden


def assert_keys(doc: dict[str, Any], keys: list[str], where: str) -> None:
    missing = [k for k in keys if k not in doc]
    assert not missing, f"{where} lacks {missing}: {doc}"
