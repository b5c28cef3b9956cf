"""The engine call is a transport (issue 38): server/upstream.py carries bytes, and every agent feature that
reads or changes an answer is a step of the serving layer (server/served_call.py), one place each."""

from __future__ import annotations

import ast
from pathlib import Path

import modelrunner.server.upstream as upstream

FEATURES = ("modelrunner.compat", "modelrunner.server.errors", "modelrunner.engines")


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_engine_call_knows_no_agent_feature() -> None:
    found = {name for name in imported(Path(upstream.__file__)) if name.startswith(FEATURES)}
    assert found == set()


def test_the_engine_call_offers_bytes_only() -> None:
    offered = {name for name in vars(upstream.EngineCall) if not name.startswith("_")}
    assert offered == {"send", "beside", "event_stream", "chunks", "read", "close"}
