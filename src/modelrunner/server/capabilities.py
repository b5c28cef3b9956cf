"""What a request needs of its model (images, tools) and the one rule that refuses what the model cannot do,
before any engine is asked, for every API (OpenAI chat, Anthropic Messages, Ollama, Responses: the last
two reach the engine as chat bodies).

llama-server answers an image for a model without a multimodal projector with a 500 (which SDKs retry), and
takes `tools` with a 200 when the chat template cannot render them, dropping them and the tool turns of the
history (its /props then reports `chat_template_caps.supports_tools: false`). Ollama refuses both with a
400, "<model> does not support vision|tools", deciding as here: vision from a projector, tools from the
template mentioning `tools`. Only llama.cpp bundles are judged: vLLM takes images with the model itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelrunner.artifact.model_config import ModelConfig
from modelrunner.compat.assemble import CHAT
from modelrunner.engines import llamacpp
from modelrunner.errors import BadRequest

_MESSAGES = ("/v1/messages", "/v1/messages/count_tokens")
# Content parts that carry an image: OpenAI chat's, and Anthropic's (also inside a `tool_result`).
_IMAGE_PARTS = frozenset({"image_url", "image"})


@dataclass(frozen=True)
class Needs:
    images: bool = False
    tools: bool = False

    def __bool__(self) -> bool:
        """Whether there is anything to check (most requests: no, and their model's files are not read)."""
        return self.images or self.tools


NOTHING = Needs()


def needs_of(path: str, doc: dict[str, Any]) -> Needs:
    """What the body of a request to the engine's `path` needs (chat and Messages bodies; others none)."""
    if path != CHAT and path not in _MESSAGES:
        return NOTHING
    messages = doc.get("messages")
    images = isinstance(messages, list) and any(_has_image(m) for m in messages)
    tools = bool(doc.get("tools")) or (path == CHAT and bool(doc.get("functions")))
    return Needs(images, tools)


def _has_image(item: Any) -> bool:
    content = item.get("content") if isinstance(item, dict) else None
    if isinstance(item, dict) and item.get("type") in _IMAGE_PARTS:
        return True
    return isinstance(content, list) and any(_has_image(part) for part in content)


def check(name: str, engine: str, config: ModelConfig, bundle: Path, needs: Needs) -> None:
    """BadRequest, in Ollama's words, when `needs` asks what the model cannot do."""
    if engine != llamacpp.NAME:
        return
    if needs.images and llamacpp.projector_file(bundle) is None:
        raise BadRequest(f"{name} does not support vision (the model has no multimodal projector)")
    if needs.tools and not renders_tools(config, bundle):
        raise BadRequest(f"{name} does not support tools (its chat template cannot render them)")


# What a template that thinks writes or takes: the tags of Ollama's thinking.InferTags, the switch of
# Qwen3's templates, the reasoning field of DeepSeek's, gpt-oss's analysis channel.
_THINKING_MARKS = ("<think>", "enable_thinking", "reasoning_content", "<|channel|>")


def shown(config: ModelConfig, bundle: Path) -> list[str]:
    """What the model's template and projector allow, as Ollama's `/api/show` lists it (server/images.go
    Capabilities): `tools`, `vision`, `thinking`, each decided as the request rule above decides."""
    template = chat_template(config, bundle)
    allowed = ["tools"] if renders_tools(config, bundle) else []
    if llamacpp.projector_file(bundle) is not None:
        allowed.append("vision")
    if template is not None and any(mark in template for mark in _THINKING_MARKS):
        allowed.append("thinking")
    return allowed


def renders_tools(config: ModelConfig, bundle: Path) -> bool:
    """Whether llama-server's chat template for the model can render tools (no template: assumed so)."""
    template = chat_template(config, bundle)
    return template is None or "tools" in template


def chat_template(config: ModelConfig, bundle: Path) -> str | None:
    """The template llama-server renders with: the bundle's file, else the GGUF's own (None: neither)."""
    path = llamacpp.template_file(bundle)
    if path is not None:
        return path.read_text(errors="replace")
    metadata = config.config.get("gguf")
    template = metadata.get("tokenizer.chat_template") if isinstance(metadata, dict) else None
    return template if isinstance(template, str) and template else None
