"""Chat requests the engines would answer wrongly are refused first, in OpenAI's words (its API refuses a
message without a role, an unknown role, and a message that is not an object with these texts)."""

from __future__ import annotations

from typing import Any

import pytest

from modelrunner.errors import BadRequest
from modelrunner.server.inference import check_request
from modelrunner.server.routes import match_route

CHAT = match_route("/engines/v1/chat/completions")


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ([], "messages: must be a non-empty list of messages"),
        (
            [{"role": "user", "content": "hi"}, {"content": "x"}],
            "Missing required parameter: 'messages[1].role'.",
        ),
        (
            [{"role": "robot", "content": "hi"}],
            "Invalid value: 'robot'. Supported values are: 'system', 'assistant', 'user', 'function', "
            "'tool', and 'developer'.",
        ),
        (["hi"], "Invalid type for 'messages[0]': expected an object."),
    ],
)
def test_a_chat_the_engine_would_mishandle_is_refused(messages: list[Any], words: str) -> None:
    assert CHAT is not None
    with pytest.raises(BadRequest) as refused:
        check_request(CHAT, {"model": "m", "messages": messages})
    assert refused.value.message == words


def test_every_openai_role_passes() -> None:
    assert CHAT is not None
    roles = ["system", "developer", "user", "assistant", "tool", "function"]
    check_request(CHAT, {"model": "m", "messages": [{"role": role, "content": "x"} for role in roles]})
