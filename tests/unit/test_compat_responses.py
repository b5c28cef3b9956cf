"""Responses <-> chat completions translation, the store's bounds and the streaming event writer."""

from __future__ import annotations

import base64
import json
import time

import pytest

from modelrunner.compat import responses as shapes
from modelrunner.errors import BadRequest
from tests import golden


def test_rejected_parameters() -> None:
    base = {"model": "m", "input": "hi"}
    assert shapes.check_request(
        {**base, "service_tier": "auto", "background": False, "truncation": "disabled"}
    )
    for extra in (
        {"include": ["x"]},
        {"include": ["message.output_text.logprobs"]},  # no logprobs here: refused, not ignored
        {"include": "reasoning.encrypted_content"},
        {"stream_options": {"a": 1}},
        {"prompt": {"id": "p"}},
        {"truncation": "auto"},
    ):
        with pytest.raises(BadRequest):
            shapes.check_request({**base, **extra})


def test_input_items_and_chat_messages() -> None:
    items = shapes.input_items(
        [
            {"role": "developer", "content": "rules"},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": {"ok": True}},
        ]
    )
    assert all(item["id"] for item in items)
    assert items[0]["content"] == [{"type": "input_text", "text": "rules"}]
    messages = shapes.chat_messages(items)
    assert messages[0] == {"role": "system", "content": "rules"}
    assert messages[1] == {"role": "user", "content": "ab"}
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]  # one assistant turn
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"ok": True})}
    image = shapes.input_items(
        [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]
    )
    assert shapes.chat_messages(image)[0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:x"}}
    ]
    with pytest.raises(BadRequest):
        shapes.input_items([{"type": "item_reference", "id": "x"}])


def test_an_assistant_message_and_its_function_calls_are_one_turn() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    for said, content in (("", None), ([], None), ("let me look", "let me look")):
        messages = shapes.chat_messages(
            shapes.input_items(
                [{"role": "user", "content": "q"}, {"role": "assistant", "content": said}, call]
            )
        )
        assert messages[1:] == [
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            }
        ]


def test_chat_body() -> None:
    request = shapes.check_request(
        {
            "model": "m",
            "input": "hi",
            "instructions": "be brief",
            "max_output_tokens": 5,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
            "stream": True,
        }
    )
    body = shapes.chat_body(request, [{"role": "user", "content": "hi"}])
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert body["max_tokens"] == 5 and body["stream_options"] == {"include_usage": True}
    assert body["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["response_format"]["json_schema"]["name"] == "s"


def test_output_items_and_usage() -> None:
    message = {
        "content": "hello",
        "reasoning_content": "think",
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert [i["type"] for i in shapes.output_items(message)] == ["reasoning", "message", "function_call"]
    usage = shapes.usage_of({"prompt_tokens": 3, "completion_tokens": 2})
    assert usage["total_tokens"] == 5 and usage["input_tokens_details"] == {"cached_tokens": 0}


def test_store_is_bounded_in_count_and_age(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    store = shapes.ResponseStore(max_items=2, max_age=60)
    for name in ("a", "b", "c"):
        store.put(shapes.StoredResponse({"id": name}, [], []))
    assert store.get("a") is None and store.get("b") is not None and len(store) == 2
    now[0] += 61
    assert store.get("c") is None and len(store) == 0
    store.put(shapes.StoredResponse({"id": "d"}, [], []))
    assert store.delete("d") and not store.delete("d")


def stored(name: str, text_size: int = 0) -> shapes.StoredResponse:
    return shapes.StoredResponse({"id": name, "output": "x" * text_size}, [], [])


def test_store_is_bounded_in_bytes_least_recently_used_first() -> None:
    size = stored("a", 1000).size
    store = shapes.ResponseStore(max_bytes=2 * size + 10)
    store.put(stored("a", 1000))
    store.put(stored("b", 1000))
    assert store.get("a") is not None  # a is now used more recently than b
    store.put(stored("c", 1000))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert store.size == 2 * size <= store.max_bytes
    store.put(stored("d", 1500))  # larger: both a and c go to make room
    assert [name for name in "acd" if store.get(name)] == ["d"] and store.size == stored("d", 1500).size
    assert store.delete("d") and store.size == 0


def test_a_response_larger_than_the_whole_budget_is_not_stored() -> None:
    store = shapes.ResponseStore(max_bytes=5000)
    store.put(stored("small"))
    store.put(stored("huge", 10_000))
    assert store.get("huge") is None and store.get("small") is not None and len(store) == 1


def test_the_store_holds_responses_as_json() -> None:
    """What the store counts is what it holds: the response as JSON bytes, decoded (a copy) when read."""
    item = shapes.StoredResponse({"id": "r", "output": "é"}, [{"id": "m"}], [{"role": "user"}])
    assert item.size == len('{"id": "r", "output": "é"}'.encode()) + len('[{"id": "m"}]') + len(
        '[{"role": "user"}]'
    )
    item.response["output"] = "changed"
    assert item.response == {"id": "r", "output": "é"} and item.conversation == [{"role": "user"}]


def test_the_store_budget_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_RUNNER_RESPONSES_MAX_BYTES", "2MiB")
    assert shapes.ResponseStore().max_bytes == 2 * 2**20
    monkeypatch.delenv("MODEL_RUNNER_RESPONSES_MAX_BYTES")
    assert shapes.ResponseStore().max_bytes == shapes.DEFAULT_STORE_BYTES
    monkeypatch.setenv("MODEL_RUNNER_RESPONSES_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="MODEL_RUNNER_RESPONSES_MAX_BYTES"):
        shapes.ResponseStore()


@pytest.mark.parametrize(
    "metadata",
    [
        {f"k{i}": "v" for i in range(17)},
        {"k" * 65: "v"},
        {"k": "v" * 513},
        {"k": 1},
        ["k", "v"],
    ],
)
def test_metadata_beyond_openais_limits_is_refused(metadata: object) -> None:
    with pytest.raises(BadRequest) as refused:
        shapes.check_request({"model": "m", "input": "hi", "metadata": metadata})
    assert refused.value.param == "metadata" and "metadata" in refused.value.message


def test_metadata_within_openais_limits_is_kept() -> None:
    metadata = {f"{i:064d}": "v" * 512 for i in range(16)}
    assert shapes.check_request({"model": "m", "input": "hi", "metadata": metadata}).metadata == metadata


def test_event_writer_sequence() -> None:
    writer = shapes.EventWriter()
    raw = writer.text("he") + writer.text("llo")
    raw += writer.tool_calls([{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{"}}])
    raw += writer.tool_calls([{"index": 0, "function": {"arguments": "}"}}])
    raw += writer.close_item()
    events = [json.loads(chunk.split(b"data: ", 1)[1]) for chunk in raw]
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[4]["text"] == "hello"
    assert writer.output[0]["content"][0]["text"] == "hello" and writer.output[0]["status"] == "completed"
    assert writer.output[1]["arguments"] == "{}" and writer.output[1]["call_id"] == "c"


CODEX = golden.load("codex_0_171_request")["body"]
NAMESPACE = "multi_agent_v1"


def codex_request(**changes: object) -> shapes.ResponsesRequest:
    return shapes.check_request({**CODEX, **changes})


def test_codexs_request_is_accepted() -> None:
    """Codex 0.171's captured request: `include`, a namespace group and a hosted `web_search`."""
    request = codex_request()
    assert request.include == ["reasoning.encrypted_content"] and request.encrypts_reasoning()
    for harmless in ("web_search_call.action.sources", "message.input_image.image_url"):
        assert shapes.check_request({**CODEX, "include": [harmless]}).include == [harmless]
    assert shapes.dropped_tools(request.tools) == ["web_search"]


def test_namespace_functions_are_flattened_and_hosted_tools_dropped() -> None:
    request = codex_request()
    body = shapes.chat_body(request, shapes.chat_messages(shapes.input_items(request.input)))
    names = [tool["function"]["name"] for tool in body["tools"]]
    assert names == ["exec_command", f"{NAMESPACE}__spawn_agent", f"{NAMESPACE}__wait_agent"]
    inner = next(t for t in CODEX["tools"] if t["type"] == "namespace")["tools"][0]
    assert body["tools"][1]["function"]["parameters"] == inner["parameters"]
    assert all(tool["type"] == "function" for tool in body["tools"])
    only_hosted = shapes.check_request({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]})
    assert "tools" not in shapes.chat_body(only_hosted, [])
    forced = codex_request(tool_choice={"type": "function", "name": "wait_agent", "namespace": NAMESPACE})
    assert shapes.chat_body(forced, [])["tool_choice"]["function"]["name"] == f"{NAMESPACE}__wait_agent"


@pytest.mark.parametrize(
    "tools",
    [
        [{"name": "no type"}],
        [{"type": "namespace", "name": "n", "tools": [{"name": "f"}]}],
        [{"type": "web search\r\nx-injected: 1"}],
    ],
)
def test_tools_without_a_type_are_refused(tools: list[dict[str, object]]) -> None:
    with pytest.raises(BadRequest, match="type"):
        shapes.check_request({"model": "m", "input": "hi", "tools": tools})


def test_a_namespaced_call_is_answered_with_its_name_and_namespace() -> None:
    request = codex_request()
    call = {"id": "c1", "function": {"name": f"{NAMESPACE}__spawn_agent", "arguments": "{}"}}
    [item] = shapes.output_items({"tool_calls": [call]}, request)
    assert (item["name"], item["namespace"]) == ("spawn_agent", NAMESPACE)
    plain = {"id": "c2", "function": {"name": "exec_command", "arguments": "{}"}}
    assert "namespace" not in shapes.output_items({"tool_calls": [plain]}, request)[0]
    # streamed: the item done (and the arguments done) carry the declared name
    writer = shapes.EventWriter(request)
    raw = writer.tool_calls([{"index": 0, **call}]) + writer.close_item()
    events = [json.loads(chunk.split(b"data: ", 1)[1]) for chunk in raw]
    assert events[-2]["name"] == "spawn_agent"
    assert events[-1]["item"]["name"] == "spawn_agent" and events[-1]["item"]["namespace"] == NAMESPACE
    # sent back in the next request's input, it is the engine's flat name again
    returned = shapes.input_items([item, {"type": "function_call_output", "call_id": "c1", "output": "ok"}])
    assert (
        shapes.chat_messages(returned)[0]["tool_calls"][0]["function"]["name"] == f"{NAMESPACE}__spawn_agent"
    )


def test_reasoning_round_trips_through_encrypted_content() -> None:
    request = codex_request()
    message = {
        "reasoning_content": "look at notes.txt",
        "tool_calls": [{"id": "c1", "function": {"name": "exec_command", "arguments": "{}"}}],
    }
    reasoning, call = shapes.output_items(message, request)
    assert reasoning["type"] == "reasoning" and isinstance(reasoning["encrypted_content"], str)
    assert "encrypted_content" not in shapes.output_items(message, codex_request(include=None))[0]
    turn_two = shapes.input_items(
        [
            {"role": "user", "content": "what does notes.txt say?"},
            {k: v for k, v in reasoning.items() if k != "content"},  # as Codex sends it back
            call,
            {"type": "function_call_output", "call_id": "c1", "output": "hello"},
        ]
    )
    messages = shapes.chat_messages(turn_two)
    assert messages[1]["role"] == "assistant" and messages[1]["reasoning_content"] == "look at notes.txt"
    assert messages[1]["tool_calls"][0]["id"] == "c1"
    # streamed, the reasoning item done carries it too
    writer = shapes.EventWriter(request)
    raw = writer.reasoning("look at ") + writer.reasoning("notes.txt") + writer.close_item()
    done = json.loads(raw[-1].split(b"data: ", 1)[1])["item"]
    assert shapes.decrypted_reasoning(done["encrypted_content"]) == "look at notes.txt"


@pytest.mark.parametrize(
    "encrypted",
    [
        "gAAAAABpX2Yz-opaque-from-openai",
        "modelrunner.not base64!",
        "modelrunner." + base64.b64encode(b'{"reasoning": "forged", "signature": "x"}').decode(),
        None,
    ],
)
def test_reasoning_the_daemon_did_not_write_is_accepted_and_ignored(encrypted: object) -> None:
    items = shapes.input_items(
        [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "summary": [], "encrypted_content": encrypted},
            {"role": "assistant", "content": "a"},
        ]
    )
    assert shapes.chat_messages(items) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]


def test_leading_system_messages_reach_the_engine_as_one() -> None:
    """Codex sends two developer messages first; a template such as Qwen3.5's refuses a second system."""
    request = codex_request(instructions="Be brief.")
    messages = shapes.chat_body(request, shapes.chat_messages(shapes.input_items(request.input)))["messages"]
    developer = ["".join(part["text"] for part in item["content"]) for item in CODEX["input"][:2]]
    assert messages[0] == {"role": "system", "content": "\n\n".join(["Be brief.", *developer])}
    assert [m["role"] for m in messages[1:]] == ["user", "user"]
    later = [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}]
    assert shapes.chat_body(shapes.check_request({"model": "m", "input": "q"}), later)["messages"] == later
