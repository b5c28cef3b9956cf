"""What a request needs of its model (images, tools), read from its body the same way for every API (OpenAI
chat, Anthropic Messages, Ollama, Responses: the last two reach the engine as chat bodies). Whether the
model can do it is its engine's to say (`Engine.check_request`), before the engine is asked.
"""

from __future__ import annotations

from typing import Any

from modelrunner.compat.assemble import CHAT
from modelrunner.engines.base import NOTHING, Needs

__all__ = ["NOTHING", "Needs", "needs_of"]

_MESSAGES = ("/v1/messages", "/v1/messages/count_tokens")
# Content parts that carry an image: OpenAI chat's, and Anthropic's (also inside a `tool_result`).
_IMAGE_PARTS = frozenset({"image_url", "image"})


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
