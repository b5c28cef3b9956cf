"""What a llama.cpp bundle lets a request do: images need its multimodal projector, tools a chat template
that renders them (`LlamaCppEngine.check_request` and `.capabilities`).

llama-server answers an image for a model without a multimodal projector with a 500 (which SDKs retry), and
takes `tools` with a 200 when the chat template cannot render them, dropping them and the tool turns of the
history (its /props then reports `chat_template_caps.supports_tools: false`). Ollama refuses both with a
400, "<model> does not support vision|tools", deciding as here: vision from a projector, tools from the
template mentioning `tools`.
"""

from __future__ import annotations

from pathlib import Path

from modelrunner.artifact.model_config import ModelConfig
from modelrunner.engines.base import Needs
from modelrunner.errors import BadRequest

# What a template that thinks writes or takes: the tags of Ollama's thinking.InferTags, the switch of
# Qwen3's templates, the reasoning field of DeepSeek's, gpt-oss's analysis channel.
_THINKING_MARKS = ("<think>", "enable_thinking", "reasoning_content", "<|channel|>")


def projector_file(bundle: Path) -> Path | None:
    """The multimodal projector (`--mmproj`): without one llama-server takes no image."""
    mmproj = bundle / "model" / "model.mmproj"
    return mmproj if mmproj.is_file() else None


def template_file(bundle: Path) -> Path | None:
    """The bundle's chat template (`--chat-template-file`), which replaces the GGUF's own."""
    template = bundle / "model" / "template.jinja"
    return template if template.is_file() else None


def check_request(name: str, config: ModelConfig, bundle: Path, needs: Needs) -> None:
    """BadRequest, in Ollama's words, when `needs` asks what the model cannot do."""
    if needs.images and projector_file(bundle) is None:
        raise BadRequest(f"{name} does not support vision (the model has no multimodal projector)")
    if needs.tools and not renders_tools(chat_template(config, bundle)):
        raise BadRequest(f"{name} does not support tools (its chat template cannot render them)")


def capabilities(config: ModelConfig, bundle: Path) -> list[str]:
    """What the model's template and projector allow, as Ollama's `/api/show` lists it (server/images.go
    Capabilities): `tools`, `vision`, `thinking`, each decided as `check_request` decides."""
    template = chat_template(config, bundle)
    allowed = ["tools"] if renders_tools(template) else []
    if projector_file(bundle) is not None:
        allowed.append("vision")
    if template is not None and any(mark in template for mark in _THINKING_MARKS):
        allowed.append("thinking")
    return allowed


def renders_tools(template: str | None) -> bool:
    """Whether llama-server's chat template for the model can render tools (no template: assumed so)."""
    return template is None or "tools" in template


def chat_template(config: ModelConfig, bundle: Path) -> str | None:
    """The template llama-server renders with: the bundle's file, else the GGUF's own (None: neither)."""
    path = template_file(bundle)
    if path is not None:
        return path.read_text(errors="replace")
    metadata = config.config.get("gguf")
    template = metadata.get("tokenizer.chat_template") if isinstance(metadata, dict) else None
    return template if isinstance(template, str) and template else None
