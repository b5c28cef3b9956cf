"""The typed client against a real daemon (the fake engine behind it): its answers as dataclasses that keep
the daemon's JSON, its failures as the error of their kind with the daemon's request id."""

from __future__ import annotations

import pytest

from modelrunner import client_errors as ce
from modelrunner.client import Client
from modelrunner.client_types import (
    DiskUsage,
    EnginesInfo,
    MemoryEstimate,
    Model,
    ModelConfiguration,
    Runner,
    Version,
)
from tests.inprocess import InProcessDaemon


def test_answers_are_typed_and_keep_the_daemons_json(fake_daemon: InProcessDaemon) -> None:
    client = Client(fake_daemon.url)
    [model] = client.list_models()
    assert isinstance(model, Model)
    assert [model.raw] == fake_daemon.http("GET", "/models").json()
    assert (model.id, model.tags, model.created) == (
        model.raw["id"],
        ["docker.io/ai/tiny:latest"],
        model.raw["created"],
    )
    assert model.config["format"] == "gguf"
    assert model.with_tags([]).raw["tags"] == [] and model.raw["tags"] == ["docker.io/ai/tiny:latest"]
    usage = client.disk_usage()
    assert isinstance(usage, DiskUsage) and usage.models > 0
    assert client.ps() == []
    client.preload("tiny")
    # listed, and released (the preload's answer may come first): two looks at it then agree
    fake_daemon.wait_for(lambda: [r for r in client.ps() if not r.raw["in_use"]], "the runner, idle")
    [runner] = client.ps()
    assert isinstance(runner, Runner)
    assert (runner.model_name, runner.backend_name, runner.mode) == (
        "tiny",
        "llama.cpp",
        "completion",
    )
    assert runner.raw == fake_daemon.http("GET", "/engines/ps").json()[0]


def test_the_daemons_descriptions_are_typed(fake_daemon: InProcessDaemon) -> None:
    """version, one model, the stored configurations, the engines and an estimate: each its own type,
    its fields read from the daemon's JSON."""
    client = Client(fake_daemon.url)
    version = client.version()
    assert isinstance(version, Version) and version.raw == fake_daemon.http("GET", "/version").json()
    assert version.version == version.raw["version"] != ""
    model = client.get_model("tiny")
    assert isinstance(model, Model) and model.raw == fake_daemon.http("GET", "/models/tiny").json()
    assert model == client.list_models()[0]
    client.configure({"model": "tiny", "context-size": 2048})
    [entry] = client.configuration("tiny")
    assert isinstance(entry, ModelConfiguration)
    assert (entry.backend, entry.model, entry.model_id, entry.mode) == (
        "llama.cpp",
        "docker.io/ai/tiny:latest",
        model.id,
        "completion",
    )
    assert (
        entry.config["context-size"] == 2048
        and [entry.raw] == fake_daemon.http("GET", "/engines/_configure").json()
    )
    assert client.configuration("ai/absent") == []
    info = client.engines_info()
    assert isinstance(info, EnginesInfo) and info.raw["platform"] == info.platform != ""
    assert info.engines["llama.cpp"].status == client.engines_status()["llama.cpp"]
    assert info.extra_listen == []
    estimate = client.estimate("tiny")
    assert isinstance(estimate, MemoryEstimate)
    assert (estimate.model, estimate.model_id, estimate.backend) == ("tiny", model.id, "llama.cpp")
    assert (
        estimate.memory_bytes
        == fake_daemon.http("GET", "/engines/estimate?model=tiny").json()["memory_bytes"]
    )


def test_the_types_read_what_a_dmr_daemon_leaves_out() -> None:
    """A field another daemon leaves out (or sends as null) reads as its zero value, as Go's decoder
    would; nothing raises."""
    assert Version.from_json({}) == Version("", {})
    assert ModelConfiguration.from_json({"Config": None}).config == {}
    bare = EnginesInfo.from_json({"engines": {"llama.cpp": None}, "extra_listen": None})
    assert bare.engines["llama.cpp"].status == "" and bare.extra_listen == [] and bare.accelerator == {}
    assert MemoryEstimate.from_json({"memory_bytes": "lots"}).memory_bytes == 0


def test_failures_are_their_kind_with_the_request_id(fake_daemon: InProcessDaemon) -> None:
    client = Client(fake_daemon.url)
    with pytest.raises(ce.ModelNotFound) as missing:
        client.open("GET", "/models/ai/nosuch", headers={"X-Request-Id": "trace-404"})
    assert (missing.value.status_code, missing.value.request_id) == (404, "trace-404")
    assert "nosuch" in missing.value.message
    with pytest.raises(ce.BadRequest) as bad:
        client.configure({"model": "tiny", "context-size": "large"})
    assert bad.value.status_code == 400 and bad.value.request_id  # the daemon's own id when none was sent
    assert client.configuration() == []  # refused: nothing configured


def test_a_daemon_that_does_not_listen_is_unreachable(fake_daemon: InProcessDaemon) -> None:
    fake_daemon.stop()
    with pytest.raises(ce.Unreachable) as down:
        Client(fake_daemon.url).list_models()
    assert down.value.status_code == 0 and down.value.request_id is None
