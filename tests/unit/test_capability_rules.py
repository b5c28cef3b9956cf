"""What a request needs (server/capabilities.py), read the same for every API, and the engine's check every
API's requests pass before the engine is asked (`Engine.check_request`): on llama.cpp an image needs a
multimodal projector in the bundle, tools a chat template that renders them; other engines take both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelrunner.artifact.model_config import ModelConfig
from modelrunner.engines import llamacpp
from modelrunner.engines.base import Engine
from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.engines.registry import default_registry
from modelrunner.errors import BadRequest
from modelrunner.server.capabilities import NOTHING, Needs, needs_of

check = LlamaCppEngine().check_request

PNG = "data:image/png;base64,iVBORw0KGgo="
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("path", "doc", "needs"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, NOTHING),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]},
            Needs(images=True),
        ),
        ("/v1/chat/completions", {"messages": [], "tools": [TOOL]}, Needs(tools=True)),
        ("/v1/chat/completions", {"messages": [], "functions": [{"name": "f"}]}, Needs(tools=True)),
        ("/v1/chat/completions", {"messages": [], "tools": []}, NOTHING),
        (  # Anthropic: an image block, here inside a tool result
            "/v1/messages",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image", "source": {"type": "url", "url": PNG}}],
                            }
                        ],
                    }
                ],
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            },
            Needs(images=True, tools=True),
        ),
        ("/v1/messages/count_tokens", {"messages": "no list", "tools": [{"name": "f"}]}, Needs(tools=True)),
        ("/v1/embeddings", {"input": "x", "tools": [TOOL]}, NOTHING),
    ],
)
def test_what_a_request_needs(path: str, doc: dict[str, Any], needs: Needs) -> None:
    assert needs_of(path, doc) == needs


def _bundle(tmp_path: Path, mmproj: bool = False, template: str | None = None) -> Path:
    (tmp_path / "model").mkdir(parents=True)
    if mmproj:
        (tmp_path / "model" / "model.mmproj").write_bytes(b"GGUF")
    if template is not None:
        (tmp_path / "model" / "template.jinja").write_text(template)
    return tmp_path


def _config(gguf_template: str | None = None) -> ModelConfig:
    metadata = {} if gguf_template is None else {"tokenizer.chat_template": gguf_template}
    return ModelConfig(config={"format": "gguf", "gguf": metadata}, created=0)


def test_an_image_needs_a_projector(tmp_path: Path) -> None:
    with pytest.raises(BadRequest) as refused:
        check("m", _config(), _bundle(tmp_path), Needs(images=True))
    assert refused.value.status_code == 400
    assert refused.value.message.startswith("m does not support vision")
    check("m", _config(), _bundle(tmp_path / "vision", mmproj=True), Needs(images=True))


def test_tools_need_a_template_that_renders_them(tmp_path: Path) -> None:
    gemma = (Path(llamacpp.__file__).parents[1] / "templates" / "gemma3.jinja").read_text()
    with pytest.raises(BadRequest) as refused:  # the shipped template, in the bundle
        check("m", _config(), _bundle(tmp_path, template=gemma), Needs(tools=True))
    assert refused.value.message.startswith("m does not support tools")
    with pytest.raises(BadRequest):  # the GGUF's own
        check("m", _config(gemma), _bundle(tmp_path / "gguf"), Needs(tools=True))
    # the bundle's template replaces the GGUF's, as --chat-template-file does
    renders = "{% for tool in tools %}{{ tool | tojson }}{% endfor %}"
    check("m", _config(gemma), _bundle(tmp_path / "file", template=renders), Needs(tools=True))
    # no template at all: llama-server's default, not judged here
    check("m", _config(), _bundle(tmp_path / "none"), Needs(tools=True))


@pytest.mark.parametrize(
    "engine", [e for e in default_registry() if not isinstance(e, LlamaCppEngine)], ids=lambda e: e.name
)
def test_other_engines_take_images_and_tools(tmp_path: Path, engine: Engine) -> None:
    bundle = _bundle(tmp_path, template="{{ messages }}")
    engine.check_request("m", _config(), bundle, Needs(images=True, tools=True))
    assert engine.capabilities(_config(), bundle) == ["tools"]


def test_plain_requests_pass(tmp_path: Path) -> None:
    check("m", _config(), _bundle(tmp_path, template="{{ messages }}"), NOTHING)


def test_shown_capabilities_follow_the_request_check(tmp_path: Path) -> None:
    shown = LlamaCppEngine().capabilities
    assert shown(_config(), _bundle(tmp_path / "plain", template="{{ messages }}")) == []
    vision = _bundle(tmp_path / "vision", mmproj=True, template="{{ tools }}<think>")
    assert shown(_config(), vision) == ["tools", "vision", "thinking"]
    assert shown(_config(), _bundle(tmp_path / "none")) == ["tools"]
