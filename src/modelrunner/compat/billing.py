"""Claude Code's billing block, taken out of a request before any engine sees it.

Since 2.1.36 Claude Code opens its system prompt with a text block such as
`x-anthropic-billing-header: cc_version=2.1.177.a3f; cc_entrypoint=cli; cch=1b2c3;` whose fields are
recomputed on every request: rendered first in the prompt, it makes every turn miss the engine's prefix
cache from the first tokens on. The block is metadata for Anthropic's billing, not an instruction to the
model, so it is dropped (not replaced by a constant): the prompt is then the one Claude Code sends with
`CLAUDE_CODE_ATTRIBUTION_HEADER=0`, both share one cached prefix, and no tokens are spent on it. It comes
as an Anthropic `system` block, or, through proxies that turn Messages into chat completions, as a system
message (its own, one of its text parts, or the first line of a joined system text).
"""

from __future__ import annotations

from typing import Any

from modelrunner.compat.assemble import CHAT, MESSAGES

PREFIX = "x-anthropic-billing-header:"
COUNT_TOKENS = MESSAGES + "/count_tokens"
_SYSTEM_ROLES = ("system", "developer")


def neutralised(path: str, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` without billing lines in its system prompt: a new object when it had some, else `doc` itself
    (so a caller knows whether to write the body again)."""
    if path in (MESSAGES, COUNT_TOKENS) and "system" in doc:
        system = _content(doc["system"])
        if system is doc["system"]:
            return doc
        out = {k: v for k, v in doc.items() if k != "system"}
        return out if system is None else {**out, "system": system}
    if path == CHAT and isinstance(doc.get("messages"), list):
        messages: list[Any] = []
        changed = False
        for message in doc["messages"]:
            if isinstance(message, dict) and message.get("role") in _SYSTEM_ROLES and "content" in message:
                content = _content(message["content"])
                if content is not message["content"]:
                    changed = True
                    if content is not None:
                        messages.append({**message, "content": content})
                    continue
            messages.append(message)
        if not changed or not messages:  # never an empty conversation
            return doc
        return {**doc, "messages": messages}
    return doc


def _content(content: Any) -> Any:
    """A system content (text or text blocks) without its billing lines: the same object when it has
    none, None when nothing is left."""
    if isinstance(content, str):
        text = _text(content)
        return content if text is content else (text or None)
    if not isinstance(content, list):
        return content
    blocks: list[Any] = []
    changed = False
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            text = _text(block["text"])
            if text is not block["text"]:
                changed = True
                if text:
                    blocks.append({**block, "text": text})
                continue
        blocks.append(block)
    if not changed:
        return content
    return blocks or None


def _text(text: str) -> str:
    """`text` less a first line that is a billing header (the same object when it is not one)."""
    if not text.startswith(PREFIX):
        return text
    _, _, rest = text.partition("\n")
    return rest
