"""Scheduler behaviour through real HTTP, real engine processes (a scripted fake engine) and the real
relay: single-flight loads, keep-alive, eviction, the wait queue, crashes, configure persistence."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conformance.dmr_daemons import FakeDaemons
from tests.fake_engine import SCRIPT, FakeEngine
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf

Start = Callable[..., InProcessDaemon]


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


@pytest.fixture
def relay() -> str:
    """Which relay answers plain inference requests: the HTTP front, or (parametrized) the ASGI stack."""
    return "front"


# The relay's behaviour, tested on both relays (the ASGI one serves requests the front hands over).
both_relays = pytest.mark.parametrize("relay", ["front", "asgi"])


@pytest.fixture
def start(fake_daemons: FakeDaemons, events: Path, relay: str) -> Start:
    def starter(env: dict[str, str] | None = None, memory: int = 1000, **limits: Any) -> InProcessDaemon:
        engine = FakeEngine(env={"FAKE_EVENTS": str(events), **(env or {})}, memory=memory)
        return fake_daemons.start(engines={"llama.cpp": engine}, front=relay == "front", models=(), **limits)

    return starter


def read_events(path: Path, name: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == name]


def event_fields(record: logging.LogRecord) -> dict[str, Any]:
    """An event's fields: modelrunner.eventlog logs them as the record's `fields` (an `extra`)."""
    fields: dict[str, Any] = record.__dict__["fields"]
    return fields


def package(daemon: InProcessDaemon, tmp_path: Path, name: str, seed: int = 0) -> None:
    gguf = write_tiny_gguf(tmp_path / f"{name}.gguf", seed=seed)
    response = daemon.http("POST", "/models/package", json={"target": name, "gguf": str(gguf)})
    assert response.status_code == 201, response.text


def chat(daemon: InProcessDaemon, model: str, stream: bool = False, **kwargs: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return daemon.http("POST", "/engines/v1/chat/completions", json=body, **kwargs)


def test_concurrent_first_requests_start_one_engine(start: Start, tmp_path: Path, events: Path) -> None:
    daemon = start(env={"FAKE_START_DELAY": "0.5"})
    package(daemon, tmp_path, "tiny")
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda _: chat(daemon, "tiny"), range(16)))
    assert [r.status_code for r in responses] == [200] * 16
    assert len(read_events(events, "started")) == 1
    assert len(read_events(events, "request")) == 16
    [runner] = daemon.ps()
    assert runner["model_name"] == "tiny" and runner["in_use"] is False and runner["loading"] is False


@both_relays
def test_streaming_is_relayed_chunk_by_chunk(start: Start, tmp_path: Path) -> None:
    daemon = start(env={"FAKE_CHUNKS": "4"})
    package(daemon, tmp_path, "tiny")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    contents = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert contents == ["t0 ", "t1 ", "t2 ", "t3 ", None]  # then the finish reason


def test_preload_only_loads_without_answering(start: Start, tmp_path: Path, events: Path) -> None:
    daemon = start()
    package(daemon, tmp_path, "tiny")
    response = daemon.http(
        "POST",
        "/engines/v1/chat/completions",
        json={"model": "tiny", "messages": []},
        headers={"X-Preload-Only": "true"},
    )
    assert response.status_code == 200 and response.content == b""
    assert len(read_events(events, "started")) == 1 and not read_events(events, "request")


def test_keep_alive_zero_unloads_when_idle(start: Start, tmp_path: Path) -> None:
    daemon = start()
    package(daemon, tmp_path, "tiny")
    assert chat(daemon, "tiny").status_code == 200
    assert (
        daemon.http("POST", "/engines/_configure", json={"model": "tiny", "keep_alive": "0"}).status_code
        == 202
    )
    daemon.wait_for(lambda: daemon.ps() == [], "the preloaded runner to expire")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "keep_alive": "1s"}
    assert daemon.http("POST", "/v1/chat/completions", json=body).status_code == 200
    daemon.wait_for(lambda: daemon.ps() == [], "the runner to expire after its per-request keep_alive")


def test_lru_eviction_within_a_memory_budget(start: Start, tmp_path: Path) -> None:
    daemon = start(memory=1000, memory_budget=2500)
    for i, name in enumerate(("one", "two", "three")):
        package(daemon, tmp_path, name, seed=i)
    assert chat(daemon, "one").status_code == 200
    assert chat(daemon, "two").status_code == 200
    assert chat(daemon, "one").status_code == 200  # "two" is now the least recently used
    assert chat(daemon, "three").status_code == 200
    assert sorted(r["model_name"] for r in daemon.ps()) == ["one", "three"]
    metrics = daemon.http("GET", "/metrics").text
    assert "modelrunner_evictions_total 1" in metrics


def test_a_model_larger_than_the_budget_is_refused(start: Start, tmp_path: Path) -> None:
    daemon = start(memory=5000, memory_budget=1000)
    package(daemon, tmp_path, "tiny")
    response = chat(daemon, "tiny")
    assert response.status_code == 507
    assert "memory budget" in response.json()["error"]["message"]


@both_relays
def test_busy_runners_queue_and_a_full_queue_answers_503(start: Start, tmp_path: Path) -> None:
    # "one" streams for 6 s: the checks below, on a loaded machine, happen while it is busy
    daemon = start(env={"FAKE_CHUNKS": "60", "FAKE_CHUNK_DELAY": "0.1"}, max_runners=1, max_waiting=1)
    package(daemon, tmp_path, "one", seed=1)
    package(daemon, tmp_path, "two", seed=2)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        busy = pool.submit(chat, daemon, "one", True)
        daemon.wait_for(lambda: any(r["in_use"] for r in daemon.ps()), "model one to be busy")
        waiting = pool.submit(chat, daemon, "two")
        daemon.wait_for(
            lambda: "modelrunner_queue_depth 1" in daemon.http("GET", "/metrics").text, "a waiter"
        )
        refused = chat(daemon, "two")
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        assert busy.result().status_code == 200
        assert waiting.result().status_code == 200  # served once "one" was released and evicted
    assert [r["model_name"] for r in daemon.ps()] == ["two"]


@both_relays
def test_engine_crash_mid_stream_then_reload(start: Start, tmp_path: Path, events: Path) -> None:
    daemon = start(env={"FAKE_CRASH_AFTER": "2"})
    package(daemon, tmp_path, "tiny")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    error = json.loads(lines[-1][6:])["error"]
    assert error["type"] == "server_error" and "engine stopped" in error["message"]
    # every stream of this engine crashes: a load without inference shows the runner comes back
    assert chat(daemon, "tiny", headers={"X-Preload-Only": "true"}).status_code == 200
    assert len(read_events(events, "started")) == 2


def test_engine_that_fails_to_start_gives_its_message_without_paths(start: Start, tmp_path: Path) -> None:
    daemon = start(env={"FAKE_EXIT_AT_START": "7"})
    package(daemon, tmp_path, "tiny")
    response = chat(daemon, "tiny")
    assert response.status_code == 500
    message = response.json()["error"]["message"]
    assert message.startswith("unable to load runner")
    assert "code 7" in message and "model.gguf" in message
    assert str(tmp_path) not in message and "/tmp" not in message
    assert daemon.ps() == []


@both_relays
def test_client_disconnect_cancels_the_engine_request(start: Start, tmp_path: Path, events: Path) -> None:
    daemon = start(env={"FAKE_CHUNKS": "200", "FAKE_CHUNK_DELAY": "0.05"})
    package(daemon, tmp_path, "tiny")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # leave after the first chunk
    daemon.wait_for(lambda: read_events(events, "cancelled"), "the engine to see the cancellation")
    daemon.wait_for(lambda: not any(r["in_use"] for r in daemon.ps()), "the runner to be released")


def test_configure_persists_across_a_daemon_restart(start: Start, tmp_path: Path, events: Path) -> None:
    daemon = start()
    package(daemon, tmp_path, "tiny")
    request = {
        "model": "tiny",
        "context-size": 1024,
        "runtime-flags": ["--fake-flag", "3"],
        "keep_alive": "10m",
    }
    assert daemon.http("POST", "/engines/_configure", json=request).status_code == 202
    daemon.stop()

    restarted = start()
    [shown] = restarted.http("GET", "/engines/_configure", params={"model": "tiny"}).json()
    assert shown["Backend"] == "llama.cpp" and shown["Mode"] == "completion"
    assert shown["Config"] == {  # DMR's BackendConfiguration (pkg/inference/backend.go)
        "context-size": 1024,
        "runtime-flags": ["--fake-flag", "3"],
        "keep_alive": "10m0s",
    }
    assert chat(restarted, "tiny").status_code == 200
    argv = read_events(events, "started")[-1]["argv"]
    assert argv[argv.index("--ctx-size") + 1] == "1024" and "--fake-flag" in argv


@both_relays
@pytest.mark.parametrize(
    ("request_kwargs", "status"),
    [
        ({"json": {"model": "absent", "messages": [{"role": "user", "content": "hi"}]}}, 404),
        ({"json": {"messages": []}}, 400),
        ({"json": {"model": "tiny", "messages": []}}, 400),  # llama-server would answer it
        ({"json": {"model": "tiny", "messages": "hi"}}, 400),
        ({"json": ["not", "an", "object"]}, 400),
        ({"content": b"{broken json", "headers": {"content-type": "application/json"}}, 400),
        ({"content": b"[" * 100_000, "headers": {"content-type": "application/json"}}, 400),  # too deep
        ({"content": b"x" * (10 * 1024 * 1024 + 1)}, 413),
        ({"json": {"model": "tiny", "messages": []}, "headers": {"host": "evil.example.com"}}, 403),
        ({"json": {"model": "tiny", "messages": []}, "headers": {"origin": "https://evil.example.com"}}, 403),
        ({"json": {"model": "tiny", "keep_alive": "forever"}}, 400),
    ],
)
def test_bad_inference_requests(
    start: Start, tmp_path: Path, request_kwargs: dict[str, Any], status: int
) -> None:
    daemon = start()
    package(daemon, tmp_path, "tiny")
    response = daemon.http("POST", "/engines/v1/chat/completions", **request_kwargs)
    assert response.status_code == status, response.text
    assert response.json()["error"]["message"]
    assert daemon.ps() == []


def test_other_methods_on_inference_routes_are_405(start: Start) -> None:
    daemon = start()
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        for path in ("/v1/chat/completions", "/engines/llama.cpp/v1/embeddings", "/rerank"):
            response = daemon.http(method, path)
            assert response.status_code == 405 and response.headers["allow"] == "POST", (method, path)
            assert "use POST" in response.json()["error"]["message"]
    assert daemon.http("HEAD", "/v1/chat/completions").status_code == 405


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "tiny", "runtime-flags": ["--not-allowed"]}, 400),
        ({"model": "tiny", "runtime-flags": ["--fake-model", "/etc/passwd"]}, 400),
        ({"model": "tiny", "context-size": 0}, 400),
        ({"model": "tiny", "keep_alive": "soon"}, 400),
        ({"model": "tiny", "vllm": {"hf-overrides": {"bad key": 1}}}, 400),
        ({"model": "tiny", "mode": "dreaming"}, 400),
        ({"model": "tiny", "unknown": True}, 400),
        ({"model": "tiny", "speculative": {"draft_model": "absent"}}, 404),
        ({"model": "tiny", "speculative": {"draft_model": 5}}, 400),
        ({"model": "tiny", "speculative": {"draft_model": "tiny", "num_tokens": 0}}, 400),
        ({"model": "tiny", "speculative": {"draft_model": "tiny", "num_tokens": "4"}}, 400),
        ({"model": "tiny", "speculative": {"draft_model": "tiny", "num_tokens": True}}, 400),
        ({"model": "tiny", "speculative": {"draft_model": "tiny", "min_acceptance_rate": 1.5}}, 400),
        ({"model": "tiny", "speculative": {"num_tokens": 4}}, 400),
        ({"model": "tiny", "speculative": {"draft": "tiny"}}, 400),
    ],
)
def test_bad_configure_requests(start: Start, tmp_path: Path, body: dict[str, Any], status: int) -> None:
    daemon = start()
    package(daemon, tmp_path, "tiny")
    response = daemon.http("POST", "/engines/_configure", json=body)
    assert response.status_code == status, response.text  # 404: the draft model is not in the store
    assert daemon.http("GET", "/engines/_configure").json() == []


def test_unknown_backend_is_404(start: Start, tmp_path: Path) -> None:
    """Inference, configure and estimate pick the engine in one place and refuse a name the same way."""
    daemon = start()
    package(daemon, tmp_path, "tiny")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    answers = [
        daemon.http("POST", "/engines/nope/v1/chat/completions", json=body),
        daemon.http("POST", "/engines/nope/_configure", json={"model": "tiny", "context-size": 2048}),
        daemon.http("GET", "/engines/estimate", params={"model": "tiny", "backend": "nope"}),
    ]
    why = "unknown backend 'nope': use one of llama.cpp"
    for response in answers:
        assert response.status_code == 404, response.text
    assert answers[0].json()["error"]["message"] == why  # OpenAI's shape
    assert [answer.text for answer in answers[1:]] == [why + "\n"] * 2  # DMR's http.Error
    assert daemon.http("GET", "/engines/_configure").json() == []
    assert daemon.ps() == []


def test_api_key_is_required_when_set(start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_RUNNER_API_KEY", "s3cret")
    daemon = start()
    assert daemon.http("GET", "/models").status_code == 401
    assert daemon.http("GET", "/models", headers={"authorization": "Bearer s3cret"}).status_code == 200
    assert daemon.http("GET", "/models", headers={"x-api-key": "s3cret"}).status_code == 200
    assert daemon.http("GET", "/").status_code == 200


def test_cors_allows_local_origins_only(start: Start) -> None:
    daemon = start()
    ok = daemon.http("GET", "/models", headers={"origin": "http://localhost:3000"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://localhost:3000"
    preflight = daemon.http(
        "OPTIONS",
        "/v1/chat/completions",
        headers={"origin": "http://127.0.0.1:8080", "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 204
    assert daemon.http("GET", "/models", headers={"origin": "http://evil.example"}).status_code == 403


def test_metrics_aggregate_engine_metrics_with_labels(start: Start, tmp_path: Path) -> None:
    daemon = start()
    package(daemon, tmp_path, "tiny")
    assert chat(daemon, "tiny").status_code == 200
    text = daemon.http("GET", "/metrics").text
    assert 'fake_requests_total{backend="llama.cpp",model="tiny",mode="completion"} 3' in text
    assert "modelrunner_loaded_runners 1" in text


def test_unload(start: Start, tmp_path: Path) -> None:
    daemon = start()
    package(daemon, tmp_path, "tiny")
    assert chat(daemon, "tiny").status_code == 200
    assert daemon.http("POST", "/engines/unload", json={"models": ["absent"]}).json() == {
        "unloaded_runners": 0
    }
    assert daemon.http("POST", "/engines/unload", json={"models": ["tiny"]}).json() == {"unloaded_runners": 1}
    assert daemon.ps() == []


def test_orphaned_engines_are_ended_at_start(start: Start, tmp_path: Path) -> None:
    from modelrunner.server.app import runtime_dir

    socket = runtime_dir() / "runner-999.sock"
    socket.parent.mkdir(parents=True, exist_ok=True)
    orphan = subprocess.Popen([sys.executable, str(SCRIPT), str(socket)], env={**os.environ})
    (runtime_dir() / "pids").mkdir(exist_ok=True)
    (runtime_dir() / "pids" / f"{orphan.pid}.json").write_text(
        json.dumps({"pid": orphan.pid, "socket": str(socket)})
    )
    daemon = start()
    assert orphan.wait(10) != 0
    assert daemon.daemon is not None and daemon.daemon.scheduler.orphans_ended == 1


# -- processes: groups, eviction order, freezes, orphans, tasks -------------------------------------------


def alive(pid: int) -> bool:
    from modelrunner.scheduler.runner import process_stat

    stat = process_stat(pid)
    return stat is not None and stat[0] != "Z"


def test_stopping_an_engine_ends_its_whole_process_group(start: Start, tmp_path: Path, events: Path) -> None:
    daemon = start(env={"FAKE_CHILD": "1"})
    package(daemon, tmp_path, "tiny")
    assert chat(daemon, "tiny").status_code == 200
    [runner] = daemon.ps()
    [child] = read_events(events, "child")
    assert alive(runner["pid"]) and alive(child["child"])
    assert daemon.http("POST", "/engines/unload", json={"models": ["tiny"]}).json() == {"unloaded_runners": 1}
    # unload returns once the whole group is gone: the worker the engine started is ended too
    assert not alive(runner["pid"]) and not alive(child["child"])


def test_a_crashed_engine_takes_its_child_processes_with_it(
    start: Start, tmp_path: Path, events: Path
) -> None:
    daemon = start(env={"FAKE_CHILD": "1", "FAKE_CRASH_AFTER": "1"})
    package(daemon, tmp_path, "tiny")
    assert "engine stopped" in chat(daemon, "tiny", stream=True).text
    [child] = read_events(events, "child")
    daemon.wait_for(lambda: not alive(child["child"]), "the crashed engine's worker to be ended")
    daemon.wait_for(lambda: daemon.ps() == [], "the defunct runner to be dropped")


def starts_and_exits(events: Path) -> list[str]:
    """The engines' `started` and `exiting` events, in order."""
    return [
        e["event"]
        for e in map(json.loads, events.read_text().splitlines())
        if e["event"] in ("started", "exiting")
    ]


def test_eviction_waits_for_the_evicted_engine_to_exit(start: Start, tmp_path: Path, events: Path) -> None:
    daemon = start(env={"FAKE_STOP_DELAY": "1"}, max_runners=1)
    package(daemon, tmp_path, "one", seed=1)
    package(daemon, tmp_path, "two", seed=2)
    assert chat(daemon, "one").status_code == 200
    assert chat(daemon, "two").status_code == 200
    order = starts_and_exits(events)
    # the evicted engine said it was exiting before the next one was started: never two at once
    assert order == ["started", "exiting", "started"]
    assert [r["model_name"] for r in daemon.ps()] == ["two"]


def test_eviction_within_the_memory_budget_waits_too(start: Start, tmp_path: Path, events: Path) -> None:
    daemon = start(env={"FAKE_STOP_DELAY": "1"}, memory=1000, memory_budget=1500)
    package(daemon, tmp_path, "one", seed=1)
    package(daemon, tmp_path, "two", seed=2)
    assert chat(daemon, "one").status_code == 200
    assert chat(daemon, "two").status_code == 200
    order = starts_and_exits(events)
    assert order == ["started", "exiting", "started"]


def test_a_frozen_engine_fails_its_requests_and_is_restarted(
    start: Start, tmp_path: Path, events: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = start(env={"FAKE_CHUNKS": "100", "FAKE_CHUNK_DELAY": "0.05"}, freeze_timeout=1.0)
    package(daemon, tmp_path, "tiny")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        [runner] = daemon.ps()
        os.kill(runner["pid"], signal.SIGSTOP)  # frozen mid-stream: it answers nothing any more
        rest = [line for line in lines if line.startswith("data: ")]
    error = json.loads(rest[-1][6:])["error"]
    assert error["type"] == "server_error" and "engine stopped" in error["message"]  # the crash path
    assert not alive(runner["pid"])
    freeze = [event_fields(r) for r in caplog.records if r.msg == "freeze"]
    assert freeze and freeze[0]["pid"] == runner["pid"] and freeze[0]["process_state"] == "T"
    assert chat(daemon, "tiny").status_code == 200  # the next request starts it again
    assert len(read_events(events, "started")) == 2


def test_a_waiting_request_to_a_frozen_engine_gets_an_error(start: Start, tmp_path: Path) -> None:
    daemon = start(freeze_timeout=1.0)
    package(daemon, tmp_path, "tiny")
    assert chat(daemon, "tiny").status_code == 200
    [runner] = daemon.ps()
    os.kill(runner["pid"], signal.SIGSTOP)
    response = chat(daemon, "tiny")  # waits on the frozen engine until the watchdog ends it
    assert response.status_code == 500
    error = response.json()  # the crash path's answer: DMR's error object for a runner that died
    assert error["type"] == "error" and "engine stopped" in error["message"]
    assert chat(daemon, "tiny").status_code == 200


def test_unloading_a_stopped_engine_ends_it(start: Start, tmp_path: Path) -> None:
    daemon = start()
    package(daemon, tmp_path, "tiny")
    assert chat(daemon, "tiny").status_code == 200
    [runner] = daemon.ps()
    os.kill(runner["pid"], signal.SIGSTOP)  # idle, so no request waits and the watchdog leaves it alone
    assert daemon.http("POST", "/engines/unload", json={"all": True}).json() == {"unloaded_runners": 1}
    assert not alive(runner["pid"])


def test_orphaned_engine_groups_are_ended_at_start_with_a_log_line(
    start: Start, tmp_path: Path, events: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from modelrunner.scheduler.runner import TAG_ENV
    from modelrunner.server.app import runtime_dir

    socket = runtime_dir() / "runner-998.sock"
    socket.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, TAG_ENV: "f" * 32, "FAKE_CHILD": "1", "FAKE_EVENTS": str(events)}
    orphan = subprocess.Popen([sys.executable, str(SCRIPT), str(socket)], env=env, start_new_session=True)
    record = {"pid": orphan.pid, "socket": str(socket), "tag": "f" * 32, "engine": "llama.cpp"}
    record["model"] = "ai/x"
    (runtime_dir() / "pids").mkdir(exist_ok=True)
    (runtime_dir() / "pids" / f"{orphan.pid}.json").write_text(json.dumps(record))
    [child] = [e["child"] for e in _wait_events(events, "child")]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    unrelated = subprocess.Popen(sleeper, start_new_session=True)
    record = {"pid": unrelated.pid, "socket": "/x.sock", "tag": "0" * 32}  # a pid now used by someone else
    (runtime_dir() / "pids" / f"{unrelated.pid}.json").write_text(json.dumps(record))
    try:
        daemon = start()
        assert orphan.wait(10) == -signal.SIGKILL
        assert not alive(child)  # its worker too, before the daemon started (scheduler/runner.py end_orphans)
        assert unrelated.poll() is None  # not ours: left alone
        assert daemon.daemon is not None and daemon.daemon.scheduler.orphans_ended == 1
        [line] = [event_fields(r) for r in caplog.records if r.msg == "orphan_ended"]
        assert line["pid"] == orphan.pid and line["model"] == "ai/x"
        assert line["processes"] == 2
        assert list((runtime_dir() / "pids").glob("*.json")) == []
    finally:
        unrelated.kill()
        unrelated.wait()


def _wait_events(path: Path, name: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = read_events(path, name)
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {name} event")


def test_shutdown_ends_every_engine_and_task(start: Start, tmp_path: Path, events: Path) -> None:
    daemon = start(env={"FAKE_CHILD": "1"})
    package(daemon, tmp_path, "one", seed=1)
    package(daemon, tmp_path, "two", seed=2)
    assert chat(daemon, "one").status_code == 200
    assert chat(daemon, "two").status_code == 200
    pids = [r["pid"] for r in daemon.ps()] + [e["child"] for e in read_events(events, "child")]
    assert len(pids) == 4 and all(map(alive, pids))
    daemon.stop()
    assert daemon.daemon is not None
    scheduler = daemon.daemon.scheduler
    assert not any(map(alive, pids))
    assert scheduler.runners == {} and scheduler.stopping == {}
    assert scheduler._tasks == set()  # every task it started (watchdogs, stops, timers) has ended
