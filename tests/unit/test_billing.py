"""compat/billing.py: Claude Code's billing block is taken out of the system prompt, whatever its fields hold,
and nothing else is touched."""

from __future__ import annotations

from typing import Any

from modelrunner.compat.billing import neutralised

LINE = "x-anthropic-billing-header: cc_version=2.1.177.a3f; cc_entrypoint=cli; cch=1b2c3;"
ODD = "x-anthropic-billing-header: whatever=it holds; tomorrow"
HI: Any = [{"role": "user", "content": "hi"}]


def test_an_anthropic_system_block_is_dropped_and_the_others_kept() -> None:
    kept = {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    for line in (LINE, ODD):
        doc = {"model": "m", "system": [{"type": "text", "text": line}, kept], "messages": HI}
        assert neutralised("/v1/messages", doc) == {"model": "m", "system": [kept], "messages": HI}
        assert neutralised("/v1/messages/count_tokens", doc)["system"] == [kept]
    assert doc["system"][0]["text"] == ODD  # the client's request is not changed in place


def test_a_system_of_only_the_block_goes_away() -> None:
    for system in (LINE, [{"type": "text", "text": LINE}]):
        assert neutralised("/v1/messages", {"system": system, "messages": HI}) == {"messages": HI}


def test_a_system_text_loses_only_its_first_line() -> None:
    doc = {"system": LINE + "\nBe brief.\nReally.", "messages": HI}
    assert neutralised("/v1/messages", doc)["system"] == "Be brief.\nReally."


def test_chat_system_messages_parts_and_joined_text() -> None:
    for message in (
        {"role": "system", "content": LINE},
        {"role": "developer", "content": [{"type": "text", "text": LINE}]},
    ):
        doc = {"model": "m", "messages": [message, *HI]}
        assert neutralised("/v1/chat/completions", doc) == {"model": "m", "messages": HI}
    parts = [{"type": "text", "text": LINE}, {"type": "text", "text": "Be brief."}]
    doc = {"messages": [{"role": "system", "content": parts}, *HI]}
    assert neutralised("/v1/chat/completions", doc)["messages"][0]["content"] == parts[1:]
    doc = {"messages": [{"role": "system", "content": LINE + "\nBe brief."}, *HI]}
    system = neutralised("/v1/chat/completions", doc)["messages"][0]
    assert system == {"role": "system", "content": "Be brief."}


def test_requests_without_the_block_are_the_same_object() -> None:
    for path, doc in (
        ("/v1/messages", {"system": [{"type": "text", "text": "Be brief."}], "messages": HI}),
        ("/v1/messages", {"system": "Be brief. " + LINE, "messages": HI}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LINE}]}),  # not a system prompt
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": None}, *HI]}),
        ("/v1/completions", {"prompt": LINE}),
        ("/v1/messages", {"system": 3, "messages": HI}),
    ):
        assert neutralised(path, doc) is doc


def test_a_conversation_is_never_left_empty() -> None:
    doc = {"messages": [{"role": "system", "content": LINE}]}
    assert neutralised("/v1/chat/completions", doc) is doc
