"""`POST /engines/_configure` as DMR's scheduler treats it: each request is the model's whole configuration
(nothing merged with the one before), the same configuration again changes nothing, and only a runner that
answers requests refuses a new one (409); a runner still loading is not in use.

Follows: `pkg/inference/scheduling/loader.go` (setRunnerConfig, evictRunner; load keeps a loading runner
out of `runners`), `pkg/inference/scheduling/scheduler.go` (ConfigureRunner), `pkg/inference/scheduling/
http_handler.go` (Configure: 409 for errRunnerAlreadyActive, then the preload), `cmd/cli/commands/
configure.go` and `configure_flags.go` (BuildConfigureRequest), `cmd/cli/commands/compose.go` (up).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx

from tests.conformance.dmr_daemons import cli_env, package, run_cli
from tests.conformance.test_wire_scheduler import send
from tests.fake_engine import FakeEngine
from tests.inprocess import InProcessDaemon

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def fake_engine(daemon: InProcessDaemon) -> FakeEngine:
    engine = daemon.engines["llama.cpp"]
    assert isinstance(engine, FakeEngine)
    return engine


def shown(daemon: InProcessDaemon) -> dict[str, Any]:
    [entry] = daemon.http("GET", "/engines/_configure?model=tiny").json()
    config: dict[str, Any] = entry["Config"]
    return config


def loaded(daemon: InProcessDaemon) -> dict[str, Any]:
    """The model's one runner, once it has loaded."""
    daemon.wait_for(lambda: [r["loading"] for r in daemon.ps()] == [False], "the runner to be loaded")
    [runner] = daemon.ps()
    return runner


def loading_pid(daemon: InProcessDaemon, other_than: int | None = None) -> int:
    """The pid of the model's one runner while it is loading (a new one when `other_than` is given)."""

    def started() -> bool:
        runners = daemon.ps()
        return len(runners) == 1 and runners[0]["loading"] and runners[0]["pid"] not in (None, other_than)

    daemon.wait_for(started, "a runner to be loading")
    pid: int = daemon.ps()[0]["pid"]
    return pid


def argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_the_same_configuration_again_keeps_the_engine(fake_daemon: InProcessDaemon) -> None:
    """loader.go setRunnerConfig: an unchanged configuration returns at once, nothing evicted; so the
    preload that follows (http_handler.go Configure) finds the same engine."""
    body = '{"model":"tiny","context-size":2048,"runtime-flags":["--fake-x","2"]}'
    assert send(fake_daemon, "POST", "/engines/_configure", body).status_code == 202
    pid = loaded(fake_daemon)["pid"]
    assert send(fake_daemon, "POST", "/engines/_configure", body).status_code == 202
    # as Compose sends it (compose.go: raw-runtime-flags): the same configuration
    compose = '{"model":"tiny","raw-runtime-flags":"--fake-x 2","context-size":2048}'
    assert send(fake_daemon, "POST", "/engines/_configure", compose).status_code == 202
    assert send(fake_daemon, "POST", "/engines/llama.cpp/_configure", body).status_code == 202
    assert fake_daemon.http("POST", "/engines/v1/chat/completions", json=CHAT).status_code == 200
    assert loaded(fake_daemon)["pid"] == pid


def test_configure_with_nothing_set_keeps_an_engine_on_the_defaults(fake_daemon: InProcessDaemon) -> None:
    """`docker model configure tiny` sends `{"model":"tiny"}` (configure_flags.go BuildConfigureRequest):
    an empty configuration, stored as such. An engine already on the defaults keeps running (DMR, with no
    stored entry to compare with, restarts it)."""
    assert fake_daemon.http("POST", "/engines/v1/chat/completions", json=CHAT).status_code == 200
    pid = loaded(fake_daemon)["pid"]
    assert send(fake_daemon, "POST", "/engines/_configure", '{"model":"tiny"}').status_code == 202
    assert shown(fake_daemon) == {}
    assert loaded(fake_daemon)["pid"] == pid


def test_a_busy_runner_takes_the_same_configuration_and_refuses_a_new_one(
    fake_daemon: InProcessDaemon,
) -> None:
    """loader.go setRunnerConfig: unchanged is accepted whatever the runner does; a change tries evictRunner
    (idle runners only) and answers errRunnerAlreadyActive, a 409 (http_handler.go Configure), while the
    runner is in use, storing nothing."""
    # a stream of a minute, which holds the runner until the client closes it
    fake_engine(fake_daemon).env.update({"FAKE_CHUNKS": "600", "FAKE_CHUNK_DELAY": "0.1"})
    body = '{"model":"tiny","context-size":2048}'
    assert send(fake_daemon, "POST", "/engines/_configure", body).status_code == 202
    pid = loaded(fake_daemon)["pid"]
    holding, done = threading.Event(), threading.Event()

    def stream() -> None:
        with httpx.stream(
            "POST",
            fake_daemon.url + "/engines/v1/chat/completions",
            json={**CHAT, "stream": True},
            timeout=60,
        ) as response:
            chunks = response.iter_raw()  # kept: a discarded iterator closes the response
            next(chunks)
            holding.set()
            done.wait(60)

    streaming = threading.Thread(target=stream, daemon=True)
    streaming.start()
    try:
        assert holding.wait(60)
        assert fake_daemon.ps()[0]["in_use"] is True
        assert send(fake_daemon, "POST", "/engines/_configure", body).status_code == 202
        changed = send(fake_daemon, "POST", "/engines/_configure", '{"model":"tiny","context-size":1024}')
        assert changed.status_code == 409
        assert "runner already active" in changed.text
        assert shown(fake_daemon) == {"context-size": 2048}
        assert fake_daemon.ps()[0]["pid"] == pid
    finally:
        done.set()
        streaming.join(60)
    fake_daemon.wait_for(lambda: not fake_daemon.ps()[0]["in_use"], "the stream to release the runner")
    assert (
        send(fake_daemon, "POST", "/engines/_configure", '{"model":"tiny","context-size":1024}').status_code
        == 202
    )
    runner = loaded(fake_daemon)
    assert runner["pid"] != pid and argv(runner["pid"])[argv(runner["pid"]).index("--ctx-size") + 1] == "1024"


def test_a_loading_runner_is_not_in_use(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """loader.go load keeps a loading runner out of `runners`, so setRunnerConfig accepts any configuration
    meanwhile (Compose's second `up` while the first one's preload loads). Here a changed one also replaces
    the load, and the requests that waited for it get an engine with the new configuration."""
    gate = tmp_path / "gate"
    fake_engine(fake_daemon).env["FAKE_START_GATE"] = str(gate)
    first = '{"model":"tiny","context-size":2048}'
    assert send(fake_daemon, "POST", "/engines/_configure", first).status_code == 202
    pid = loading_pid(fake_daemon)
    answers: list[int] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            fake_daemon.http("POST", "/engines/v1/chat/completions", json=CHAT).status_code
        ),
        daemon=True,
    )
    waiting.start()
    assert send(fake_daemon, "POST", "/engines/_configure", first).status_code == 202
    assert fake_daemon.ps()[0]["pid"] == pid
    second = '{"model":"tiny","context-size":1024}'
    assert send(fake_daemon, "POST", "/engines/_configure", second).status_code == 202
    new_pid = loading_pid(fake_daemon, other_than=pid)
    gate.touch()
    waiting.join(60)
    assert answers == [200]
    assert loaded(fake_daemon)["pid"] == new_pid
    assert argv(new_pid)[argv(new_pid).index("--ctx-size") + 1] == "1024"
    assert shown(fake_daemon) == {"context-size": 1024}


def test_configure_replaces_the_whole_configuration(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """scheduler.go ConfigureRunner builds a new BackendConfiguration from the request alone, and loader.go
    setRunnerConfig stores it whole: what a request leaves out is back to its default, in `configure show`
    and on the engine's next command line; `configure MODEL` alone resets it (configure.go sends it). The
    configuration persists here (DMR keeps it in memory), replaced the same way."""
    first = '{"model":"tiny","context-size":2048,"runtime-flags":["--fake-temp","0.3"]}'
    assert send(fake_daemon, "POST", "/engines/_configure", first).status_code == 202
    assert "--fake-temp" in argv(loaded(fake_daemon)["pid"])
    assert (
        send(fake_daemon, "POST", "/engines/_configure", '{"model":"tiny","keep_alive":"7m0s"}').status_code
        == 202
    )
    assert shown(fake_daemon) == {"keep_alive": "7m0s"}
    runner = loaded(fake_daemon)
    assert runner["keep_alive"] == "7m0s"
    assert "--fake-temp" not in argv(runner["pid"]) and "--ctx-size" not in argv(runner["pid"])

    configured = run_cli(cli_env(tmp_path, fake_daemon.url), "configure", "tiny")
    assert (configured.returncode, configured.stdout, configured.stderr) == (0, "", "")
    assert shown(fake_daemon) == {}
    fake_daemon.stop()
    restarted = InProcessDaemon(fake_daemon.home, fake_daemon.engines).start()
    try:
        assert shown(restarted) == {}
    finally:
        restarted.stop()


def test_compose_up_again_with_an_option_removed(fake_daemon: InProcessDaemon, tmp_path: Path) -> None:
    """compose.go up configures each model: a second `up` while the first one's preload still loads
    succeeds, and an option removed from compose.yaml is gone after the next `up`."""
    gate = tmp_path / "gate"
    fake_engine(fake_daemon).env["FAKE_START_GATE"] = str(gate)
    env = cli_env(tmp_path, fake_daemon.url)
    up = ("compose", "--project-name=app", "up", "--model=ai/tiny", "--context-size=2048")
    for args in [(*up, "--runtime-flags=--fake-threads 2", "llm")] * 2 + [(*up, "llm")]:
        result = run_cli(env, *args)
        assert result.returncode == 0, result.stderr
    assert shown(fake_daemon) == {"context-size": 2048}
    gate.touch()
    assert "--fake-threads" not in argv(loaded(fake_daemon)["pid"])


def test_a_model_not_pulled_yet_is_accepted_and_configures_nothing(
    fake_daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """scheduler.go ConfigureRunner: a model that GetLocal does not find is no error; ResolveID gives the
    name back and loader.go setRunnerConfig keys the configuration by it, where no load looks (loads key by
    the model's ID), and http_handler.go Configure answers 202, its preload finding no model. configure.go
    prints nothing there, so a typo goes unseen: our CLI refuses such a model (issue 37), the route still
    takes it. The request's settings are still checked: a bad one is a 400."""
    response = send(fake_daemon, "POST", "/engines/_configure", '{"model":"ai/later","context-size":2048}')
    assert (response.status_code, response.text) == (202, "")
    env = cli_env(tmp_path, fake_daemon.url)
    configured = run_cli(env, "configure", "--context-size", "2048", "ai/later", "--", "--fake-x", "1")
    assert (configured.returncode, configured.stdout) == (1, "")
    assert configured.stderr.startswith("Failed to configure ai/later: model not found")
    assert fake_daemon.http("GET", "/engines/_configure").json() == []
    assert fake_daemon.ps() == []
    bad = send(fake_daemon, "POST", "/engines/_configure", '{"model":"ai/later","context-size":0}')
    assert bad.status_code == 400 and "context-size" in bad.text
    # pulled afterwards, the model runs on its defaults
    package(fake_daemon, tmp_path, "ai/later", seed=1)
    later = {**CHAT, "model": "ai/later"}
    assert fake_daemon.http("POST", "/engines/v1/chat/completions", json=later).status_code == 200
    pid = loaded(fake_daemon)["pid"]
    assert "--ctx-size" not in argv(pid) and "--fake-x" not in argv(pid)
