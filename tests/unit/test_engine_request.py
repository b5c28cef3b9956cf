"""One request preparation for every API family (server/engine_request.py): the same rules whether the
body came from an OpenAI route (parsed once, its bytes reused when unchanged) or was built by a translation
(Ollama, Anthropic, Responses); the engine facts read from the engines in the registry."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from modelrunner.compat.assemble import CHAT, MESSAGES
from modelrunner.engines.base import Mode
from modelrunner.engines.registry import EngineRegistry, default_registry
from modelrunner.errors import BadRequest
from modelrunner.scheduler.conversations import Abandoned, Turns
from modelrunner.server import engine_request
from modelrunner.server.lifecycle import Lifecycle

BILLING = "x-anthropic-billing-header: cc_version=2.1.177.a3f; cc_entrypoint=cli; cch=1b2c3;"


class FakeInference:
    """What `prepare` asks of server/lifecycle.Inference: the registry's engines and a runner."""

    def __init__(self, engine: str, reference: str = "ai/smollm2") -> None:
        self.engines = EngineRegistry.of(default_registry())
        self.runner = SimpleNamespace(
            key=SimpleNamespace(engine=engine),
            model=SimpleNamespace(reference=reference),
            abandoned=Abandoned(),
            turns=Turns(0),
        )
        self.acquired: list[dict[str, Any]] = []

    async def acquire(
        self, name: str, mode: Mode, keep_alive: float | None, backend: str | None, **kw: Any
    ) -> Any:
        self.acquired.append({"name": name, "mode": mode, **kw})
        return self.runner


def prepare(
    inference: FakeInference, path: str, doc: dict[str, Any], **kw: Any
) -> engine_request.EngineRequest:
    async def in_an_exchange() -> engine_request.EngineRequest:
        Lifecycle(None).begin("POST", path, [])  # type: ignore[arg-type]  # no scheduler is asked
        return await engine_request.prepare(inference, doc["model"], path, doc, **kw)  # type: ignore[arg-type]

    return asyncio.run(in_an_exchange())


def test_engines_say_whether_an_unstreamed_generation_is_assembled() -> None:
    """llama-server stops generating for a client that left only in a stream; vLLM aborts by itself."""
    engines = EngineRegistry.of(default_registry())
    assert {name: engines[name].assembles_unstreamed for name in ("llama.cpp", "vllm", "diffusers")} == {
        "llama.cpp": True,
        "vllm": False,
        "diffusers": False,
    }


def test_engines_say_how_their_api_takes_schemas_and_forced_tool_choices() -> None:
    """What compat/ does for each engine is read from the engine: a grammar from a schema (llama-server and
    vLLM), the schema in llama-server's completions field, the daemon's forcing of a tool choice that
    llama-server b11434 accepts and does not apply (vLLM applies its own)."""
    engines = EngineRegistry.of(default_registry())
    facts = ("schema_grammar", "completions_json_schema", "ignores_forced_tool_choice")
    assert {
        name: [getattr(engines[name], fact) for fact in facts] for name in ("llama.cpp", "vllm", "diffusers")
    } == {
        "llama.cpp": [True, True, True],
        "vllm": [True, False, False],
        "diffusers": [False, False, False],
    }


@pytest.mark.parametrize(("engine", "assembled"), [("llama.cpp", True), ("vllm", False)])
def test_an_unstreamed_chat_is_asked_for_as_a_stream_only_where_the_engine_needs_it(
    engine: str, assembled: bool
) -> None:
    doc = {"model": "ai/smollm2", "messages": [{"role": "user", "content": "hi"}]}
    sent = json.dumps(doc).encode()
    ready = prepare(FakeInference(engine), CHAT, doc)
    assert (ready.assembling == CHAT, ready.doc.get("stream") is True) == (assembled, assembled)
    if not assembled:  # nothing changed: the client's bytes go as they are, not written again
        assert ready.body(sent) is sent


@pytest.mark.parametrize(
    ("path", "system"),
    [
        (MESSAGES, {"system": [{"type": "text", "text": BILLING}, {"type": "text", "text": "Be brief."}]}),
        (CHAT, {"messages": [{"role": "system", "content": BILLING}, {"role": "user", "content": "hi"}]}),
    ],
)
def test_every_api_family_gets_the_same_rules(path: str, system: dict[str, Any]) -> None:
    """Messages (Anthropic's path, built by its translation) and chat (the OpenAI routes, Ollama and
    Responses): the billing line dropped and another name of the loaded model sent as the runner's (vLLM
    answers only to the names it was started with)."""
    doc = {"model": "smollm2", "max_tokens": 8, "stream": True, **system}
    ready = prepare(FakeInference("vllm", reference="ai/smollm2"), path, doc)
    assert ready.changed
    assert ready.doc["model"] == "ai/smollm2"
    assert BILLING not in json.dumps(ready.doc)
    assert json.loads(ready.body(b"{}")) == ready.doc  # changed: the prepared body, not the client's


def test_a_bad_schema_is_refused_before_a_model_loads_unless_the_request_only_preloads() -> None:
    doc = {
        "model": "ai/smollm2",
        "messages": [],
        "response_format": {"type": "json_schema", "json_schema": 3},
    }
    inference = FakeInference("llama.cpp")
    with pytest.raises(BadRequest):
        prepare(inference, CHAT, doc)
    assert inference.acquired == []
    prepare(inference, CHAT, doc, preload=True)
    assert inference.acquired[0]["record"] is False  # a load without inference is not recorded


def test_embeddings_are_shortened_by_the_daemon_in_every_family() -> None:
    doc = {"model": "ai/smollm2", "input": ["a"], "dimensions": 4}
    ready = prepare(FakeInference("llama.cpp"), "/v1/embeddings", doc, mode=Mode.EMBEDDING)
    assert ready.shortening is not None and "dimensions" not in ready.doc
