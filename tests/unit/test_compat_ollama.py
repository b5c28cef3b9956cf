"""Ollama <-> OpenAI translation, without a server."""

from __future__ import annotations

import base64

import pytest

from modelrunner.compat import ollama as shapes
from modelrunner.errors import BadRequest


def test_options_become_openai_fields() -> None:
    fields = shapes.sampling_fields(
        {
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 40,
            "num_predict": 12,
            "stop": "###",
            "seed": 7,
            "presence_penalty": 0.1,
            "frequency_penalty": 0.3,
            "repeat_penalty": 1.1,
            "num_ctx": 4096,
            "unknown": 1,
        }
    )
    assert fields == {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "max_tokens": 12,
        "stop": ["###"],
        "seed": 7,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.3,
        "repeat_penalty": 1.1,
    }
    assert shapes.sampling_fields({"num_predict": -1}) == {}  # until the end: the engine's default


def test_num_ctx_is_checked() -> None:
    assert shapes.context_size_option({"num_ctx": 2048}) == 2048
    assert shapes.context_size_option(None) is None
    for bad in (0, -1, "big", True):
        with pytest.raises(BadRequest):
            shapes.context_size_option({"num_ctx": bad})


@pytest.mark.parametrize(
    ("data", "mime"),
    [
        (b"\x89PNG\r\n\x1a\nrest", "image/png"),
        (b"\xff\xd8\xff\xe0rest", "image/jpeg"),
        (b"GIF89a...", "image/gif"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image/webp"),
        (b"unknown bytes", "image/jpeg"),
    ],
)
def test_images_become_data_uris_with_sniffed_types(data: bytes, mime: str) -> None:
    encoded = base64.b64encode(data).decode()
    assert shapes.image_data_uri(encoded) == f"data:{mime};base64,{encoded}"
    assert shapes.image_data_uri("data:image/png;base64,AAAA") == "data:image/png;base64,AAAA"


def test_chat_messages_with_images_tools_and_thinking() -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    messages = [
        shapes.Message(role="user", content="look", images=[png]),
        shapes.Message(
            role="assistant",
            content="",
            thinking="hmm",
            tool_calls=[
                shapes.ToolCall(function=shapes.ToolCallFunction(name="a", arguments={"x": 1})),
                shapes.ToolCall(function=shapes.ToolCallFunction(name="b", arguments={})),
            ],
        ),
        shapes.Message(role="tool", content="B", tool_name="b"),
        shapes.Message(role="tool", content="A"),
    ]
    out = shapes.chat_messages(messages)
    assert out[0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
    ]
    assert out[1]["reasoning_content"] == "hmm"
    assert [c["id"] for c in out[1]["tool_calls"]] == ["call_1", "call_2"]
    assert out[1]["tool_calls"][0]["function"] == {"name": "a", "arguments": '{"x": 1}'}
    assert out[2]["tool_call_id"] == "call_2"  # matched by name
    assert out[3]["tool_call_id"] == "call_1"  # the oldest one left


def test_chat_body_streams_with_usage_and_sets_thinking_per_request() -> None:
    request = shapes.ChatRequest(
        model="m", messages=[shapes.Message(role="user", content="hi")], think=False, format="json"
    )
    body = shapes.chat_body(request)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["response_format"] == {"type": "json_object"}
    schema = {"type": "object"}
    body = shapes.chat_body(shapes.ChatRequest(model="m", stream=False, format=schema))
    assert "stream" not in body and body["response_format"]["json_schema"]["schema"] == schema


def test_generate_body_raw_and_chat() -> None:
    path, body = shapes.generate_body(shapes.GenerateRequest(model="m", prompt="p", system="s", stream=False))
    assert path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "system", "content": "s"}, {"role": "user", "content": "p"}]
    path, body = shapes.generate_body(shapes.GenerateRequest(model="m", prompt="p", raw=True))
    assert path == "/v1/completions" and body["prompt"] == "p"


def test_model_is_required() -> None:
    with pytest.raises(BadRequest, match="model is required"):
        shapes.ChatRequest().model_name()
    assert shapes.ChatRequest(name="old").model_name() == "old"


def test_streamed_tool_calls_are_sent_whole() -> None:
    calls = shapes.ToolCallAccumulator()
    calls.add([{"index": 0, "id": "x", "function": {"name": "wea", "arguments": '{"ci'}}])
    calls.add([{"index": 0, "function": {"name": "ther", "arguments": 'ty": "Paris"}'}}])
    calls.add([{"index": 1, "function": {"name": "b", "arguments": "not json"}}])
    assert calls.take() == [
        {"function": {"name": "weather", "arguments": {"city": "Paris"}}},
        {"function": {"name": "b", "arguments": {}}},
    ]
    assert calls.take() == []


def test_final_fields_from_usage() -> None:
    fields = shapes.final_fields(
        {"prompt_tokens": 5, "completion_tokens": 3}, {"prompt_ms": 1.5, "predicted_ms": 2.0}, 0.0, 0.25
    )
    assert fields["prompt_eval_count"] == 5 and fields["eval_count"] == 3
    assert fields["prompt_eval_duration"] == 1_500_000 and fields["eval_duration"] == 2_000_000
    assert fields["load_duration"] == 250_000_000
    assert shapes.done_reason("length") == "length" and shapes.done_reason("tool_calls") == "stop"


def test_progress_events_become_ollama_statuses() -> None:
    layer = {"id": "sha256:" + "ab" * 32, "size": 10, "current": 4}
    assert shapes.progress_status({"type": "progress", "mode": "pull", "layer": layer}) == {
        "status": "pulling " + "ab" * 6,
        "digest": layer["id"],
        "total": 10,
        "completed": 4,
    }
    assert shapes.progress_status({"type": "success"}) == {"status": "success"}
    assert shapes.progress_status({"type": "error", "message": "boom"}) == {"error": "boom"}
    assert shapes.progress_status({"type": "progress", "message": "Waiting", "layer": {}}) == {
        "status": "waiting"
    }
