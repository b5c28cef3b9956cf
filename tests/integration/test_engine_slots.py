"""An agent's side call does not throw its main loop's cached prefix away (issue 22 item 3): llama-server
as the daemon starts it keeps several slots (`-np` left to its auto value: 4 slots over one unified KV
cache, each free to use the whole configured context) and saves an idle slot to its RAM prompt cache
(`--cache-ram`, 8 GiB by default) before reusing it. So main prompt, side prompt, main prompt again: the
third is served from the cache but for its last token (with `-np 1 --cache-ram 0` only the chat template's
first 3 tokens would be). Real daemon, llama-server, tiny GGUF, the `openai` client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.daemon import Daemon
from tests.engines import tiny_daemon

MAIN: Any = [
    {"role": "system", "content": "you are a coding agent. " + "keep the code tidy and tested. " * 6},
    {"role": "user", "content": "hello"},
]
SIDE: Any = [{"role": "system", "content": "a title"}, {"role": "user", "content": "the world"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path_factory.mktemp("slots"), llama_server) as running:
        yield running


def test_a_side_call_leaves_the_main_prefix_cached(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)

    def cached(messages: Any) -> tuple[int, int]:
        answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, temperature=0)
        usage = answer.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0

    main_tokens, first = cached(MAIN)
    side_tokens, _ = cached(SIDE)
    again_tokens, again = cached(MAIN)
    assert first == 0 and main_tokens == again_tokens and main_tokens > side_tokens
    assert again == main_tokens - 1  # llama-server evaluates at least the last token again
