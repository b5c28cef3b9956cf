"""What makes a saved llama.cpp prompt cache valid for an engine run (LlamaCppEngine.kv_identity), and the
runs it is never saved for."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from modelrunner.engines.base import LaunchSpec, SlotError
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.engines.llamacpp_slots import SLOT_SAVE_FLAG
from tests.unit.test_llamacpp_engine import argv, make_bundle


@pytest.fixture
def engine(tmp_path: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch) -> LlamaCppEngine:
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    return LlamaCppEngine(install_root=tmp_path / "engines")


def spec_of(line: list[str], server: Path) -> LaunchSpec:
    return LaunchSpec(argv=[str(server), *line[1:]], socket=Path("/run/x.sock"))


def test_the_identity_ignores_what_names_the_run_only(engine: LlamaCppEngine, tmp_path: Path) -> None:
    model = make_bundle(tmp_path)
    server = engine.server_path()
    one = spec_of(argv(model, context_size=512), server)
    other = dataclasses.replace(one, argv=[a.replace("runner-1.sock", "runner-9.sock") for a in one.argv])
    saving = engine.with_slot_folder(one, tmp_path / "slots")
    assert saving.argv[-2:] == [SLOT_SAVE_FLAG, str(tmp_path / "slots")]
    identity = engine.kv_identity(model, one)
    assert engine.kv_identity(model, other) == engine.kv_identity(model, saving) == identity
    assert "b11434" in engine.kv_identity(model, one)  # the engine build


def test_the_identity_changes_with_the_context_size_and_the_cache_types(
    engine: LlamaCppEngine, tmp_path: Path
) -> None:
    model = make_bundle(tmp_path)
    server = engine.server_path()
    base = engine.kv_identity(model, spec_of(argv(model, context_size=512), server))
    assert base != engine.kv_identity(model, spec_of(argv(model, context_size=1024), server))
    flags = ("--cache-type-k", "q8_0")
    quantised = spec_of(argv(model, context_size=512, runtime_flags=flags), server)
    assert base != engine.kv_identity(model, quantised)


def test_a_sliding_window_model_is_not_saved(
    engine: LlamaCppEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_bundle(tmp_path)
    info = dataclasses.replace(engine.gguf_info(model), sliding_window=512)
    monkeypatch.setattr(engine, "gguf_info", lambda _model: info)
    with pytest.raises(SlotError, match="sliding-window"):
        engine.kv_identity(model, spec_of(argv(model), engine.server_path()))
