"""Ollama's "custom persona" (a Modelfile's FROM, SYSTEM, PARAMETER) through the official `ollama` client's
`create(model=..., from_=..., system=..., parameters=...)`, then `chat` and `generate`: the system prompt
and the parameters are kept with the new model and applied as Ollama applies them (the request's own
system message and options win); and `/api/show` says what the model's template and projector allow
(`tools`, `vision`, `thinking`), as Ollama's server/images.go Capabilities does. Real daemon, the fake
engine logging each body it receives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ollama
import pytest

from tests.conformance.dmr_daemons import FakeDaemons
from tests.fake_engine import FakeEngine
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf

PERSONA = "You are Mario from Super Mario Bros. Answer as Mario."


@pytest.fixture
def recorded(fake_daemons: FakeDaemons, tmp_path: Path) -> tuple[InProcessDaemon, Path]:
    events = tmp_path / "events.jsonl"
    engine = FakeEngine("llama.cpp", env={"FAKE_EVENTS": str(events), "FAKE_BODIES": "1"})
    return fake_daemons.start(engines={"llama.cpp": engine}), events


def last_engine_body(events: Path) -> dict[str, Any]:
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    body: dict[str, Any] = json.loads([e for e in lines if e["event"] == "request"][-1]["body"])
    return body


def test_a_persona_is_created_and_applied(recorded: tuple[InProcessDaemon, Path]) -> None:
    daemon, events = recorded
    client = ollama.Client(host=daemon.url)
    created = client.create(
        model="mario",
        from_="tiny",
        system=PERSONA,
        parameters={"temperature": 1.5, "top_k": 7, "stop": ["<|end|>", "Luigi:"]},
    )
    assert created.status == "success"

    client.chat(model="mario", messages=[{"role": "user", "content": "who are you?"}])
    sent = last_engine_body(events)
    assert sent["messages"] == [
        {"role": "system", "content": PERSONA},
        {"role": "user", "content": "who are you?"},
    ]
    assert (sent["temperature"], sent["top_k"], sent["stop"]) == (1.5, 7, ["<|end|>", "Luigi:"])

    # the request's own system message and options win
    client.chat(
        model="mario",
        messages=[{"role": "system", "content": "Be Luigi."}, {"role": "user", "content": "hi"}],
        options={"temperature": 0.1},
    )
    sent = last_engine_body(events)
    assert [m["content"] for m in sent["messages"]] == ["Be Luigi.", "hi"]
    assert (sent["temperature"], sent["top_k"]) == (0.1, 7)

    client.generate(model="mario", prompt="hello")
    assert last_engine_body(events)["messages"][0] == {"role": "system", "content": PERSONA}
    client.generate(model="mario", prompt="hello", system="Be brief.")
    assert last_engine_body(events)["messages"][0] == {"role": "system", "content": "Be brief."}

    # the model it came from is unchanged (the same artifact: the persona is the tag's)
    client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}])
    sent = last_engine_body(events)
    assert [m["role"] for m in sent["messages"]] == ["user"] and "temperature" not in sent

    assert daemon.http("POST", "/api/show", json={"model": "mario"}).json()["system"] == PERSONA
    shown = client.show("mario")
    assert shown.parameters is not None and 'stop                           "Luigi:"' in shown.parameters
    assert shown.modelfile is not None and f'SYSTEM """{PERSONA}"""' in shown.modelfile


def test_a_persona_follows_copy_and_create_from_and_goes_with_delete(
    recorded: tuple[InProcessDaemon, Path],
) -> None:
    daemon, events = recorded
    client = ollama.Client(host=daemon.url)
    client.create(model="mario", from_="tiny", system=PERSONA, parameters={"temperature": 1.5})
    client.copy("mario", "mario2")
    client.create(model="mario-cold", from_="mario", parameters={"temperature": 0.0})
    for name, temperature in (("mario2", 1.5), ("mario-cold", 0.0)):
        client.chat(model=name, messages=[{"role": "user", "content": "hi"}])
        sent = last_engine_body(events)
        assert sent["messages"][0] == {"role": "system", "content": PERSONA}, name
        assert sent["temperature"] == temperature, name
    client.delete("mario")
    client.create(model="mario", from_="tiny")  # a new model of that name: no persona left over
    client.chat(model="mario", messages=[{"role": "user", "content": "hi"}])
    assert [m["role"] for m in last_engine_body(events)["messages"]] == ["user"]
    # DMR's rm of the name (the same model as `tiny`, so a tag of it later names that model again)
    assert daemon.http("DELETE", "/models/mario2").status_code == 200
    assert daemon.http("POST", "/models/tiny/tag", params={"repo": "mario2"}).status_code == 201
    client.chat(model="mario2", messages=[{"role": "user", "content": "hi"}])
    assert [m["role"] for m in last_engine_body(events)["messages"]] == ["user"]


def test_show_says_what_the_template_and_projector_allow(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    def packaged(name: str, template: str, projector: bool = False) -> list[str]:
        gguf = write_tiny_gguf(tmp_path / f"{name}.gguf", chat_template=False, seed=9)
        (tmp_path / f"{name}.jinja").write_text(template)
        body: dict[str, Any] = {
            "target": name,
            "gguf": str(gguf),
            "chat_template": str(tmp_path / f"{name}.jinja"),
        }
        if projector:
            (tmp_path / "mmproj.gguf").write_bytes(write_tiny_gguf(tmp_path / "p.gguf", seed=10).read_bytes())
            body["mmproj"] = str(tmp_path / "mmproj.gguf")
        response = fake_daemon.http("POST", "/models/package", json=body)
        assert response.status_code == 201, response.text
        capabilities = ollama.Client(host=fake_daemon.url).show(name).capabilities
        assert capabilities is not None
        return list(capabilities)

    plain = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    assert packaged("plain", plain) == ["completion", "embedding"]
    tools = "{% if tools %}{{ tools | tojson }}{% endif %}" + plain
    assert packaged("tooled", tools) == ["completion", "embedding", "tools"]
    thinking = plain + "{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"
    assert packaged("thinker", thinking, projector=True) == ["completion", "embedding", "vision", "thinking"]


def test_ollama_answers_are_kept_where_dmrs_ollama_layer_differs(fake_daemon: InProcessDaemon) -> None:
    """DMR's pkg/ollama/http_handler.go handleGenerate answers an empty prompt with `{}` (no load) and
    handleDelete with `{}`; Ollama's clients read Ollama's answers, so those are kept (README: the list of
    what differs from DMR): the load's final line, and an empty 200."""
    loaded = fake_daemon.http("POST", "/api/generate", json={"model": "tiny", "prompt": "", "stream": False})
    assert loaded.status_code == 200
    assert loaded.json()["done"] is True and loaded.json()["done_reason"] == "load"
    assert ollama.Client(host=fake_daemon.url).generate(model="tiny", prompt="").done_reason == "load"
    assert [runner["model_name"] for runner in fake_daemon.ps()] == ["tiny"]  # loaded
    fake_daemon.http("POST", "/api/copy", json={"source": "tiny", "destination": "gone"})
    deleted = fake_daemon.http("DELETE", "/api/delete", json={"model": "gone"})
    assert (deleted.status_code, deleted.content) == (200, b"")
    missing = fake_daemon.http("DELETE", "/api/delete", json={"model": "gone"})
    assert missing.status_code == 404 and set(missing.json()) == {"error"}  # Ollama's, not DMR's text
