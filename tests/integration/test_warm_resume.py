"""Warm resume with the real llama-server (b11434) and the tiny GGUF: a model's prompt cache outlives its
engine (unload, a daemon restart), is restored only into an engine it is valid for, a restore that fails
leaves a clean engine, and saved caches keep to their byte budget."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelrunner.engines.llamacpp import LlamaCppEngine
from modelrunner.scheduler import warm
from modelrunner.scheduler.kv_persist import KvStore
from tests.daemon import Daemon, free_port, parse_logfmt
from tests.engines import tiny_daemon
from tests.inprocess import InProcessDaemon
from tests.models import write_tiny_gguf

# ~200 tokens of the tiny model's vocabulary: a prefix an agent would send on every turn
PROMPT = " ".join(f"tool{i} reads file{i}." for i in range(8))


@pytest.fixture
def daemon(tmp_path: Path, llama_server: Path) -> Iterator[Daemon]:
    with tiny_daemon(tmp_path, llama_server) as running:
        yield running


def ask(daemon: Daemon | InProcessDaemon, prompt: str = PROMPT, **fields: Any) -> dict[str, Any]:
    body = {
        "model": "tiny",
        "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "next?"}],
        "max_tokens": 8,
        "temperature": 0,
        **fields,
    }
    response = daemon.http("POST", "/engines/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def unload(daemon: Daemon | InProcessDaemon) -> None:
    assert daemon.http("POST", "/engines/unload", json={"models": ["tiny"]}).json() == {"unloaded_runners": 1}


def events(daemon: Daemon, name: str) -> list[dict[str, str]]:
    lines = (daemon.home / "logs" / "daemon.log").read_text().splitlines()
    return [e for e in map(parse_logfmt, lines) if e.get("event") == name]


def entries(daemon: Daemon) -> list[Path]:
    return sorted(p.parent for p in (daemon.store_root / "cache" / "kv").glob("*/*/manifest.json"))


def restores(daemon: Daemon, result: str) -> str:
    text = daemon.http("GET", "/metrics").text
    return next(line for line in text.splitlines() if f'kv_restore_total{{result="{result}"}}' in line)


def test_an_unloaded_model_resumes_its_prompt_cache_with_the_same_greedy_answer(daemon: Daemon) -> None:
    cold = ask(daemon)
    assert cached(cold) == 0
    unload(daemon)
    [saved] = events(daemon, "kv_saved")
    assert int(saved["tokens"]) >= cold["usage"]["prompt_tokens"] and int(saved["bytes"]) > 0
    assert daemon.http("GET", "/engines/df").json()["kv_cache_disk_usage"] >= int(saved["bytes"])

    warm = ask(daemon)
    prompt = warm["usage"]["prompt_tokens"]
    assert cached(warm) >= prompt - 1  # all but the last token, which the engine evaluates again
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    [restored] = events(daemon, "kv_restored")
    assert restored["tokens"] == saved["tokens"]
    [runner] = daemon.http("GET", "/engines/ps").json()
    assert runner["warm"]["state"] == "restored"
    assert f"{restored['tokens']} tokens restored" in daemon.cli("ps").stdout
    assert restores(daemon, "hit").endswith(" 1")

    daemon.cli("rm", "tiny")  # a model's saved caches go with it
    assert entries(daemon) == []


def test_a_restore_that_fails_drops_the_entry_and_the_engine_restarts_clean(daemon: Daemon) -> None:
    cold = ask(daemon)
    unload(daemon)
    [entry] = entries(daemon)
    for slot in entry.glob("slot-*.bin"):  # same size, not a slot file any more: llama-server refuses it
        slot.write_bytes(b"\0" * slot.stat().st_size)

    again = ask(daemon)
    assert cached(again) == 0
    assert again["choices"][0]["message"] == cold["choices"][0]["message"]
    [failed] = events(daemon, "kv_restore_failed")
    assert "restarts clean" in failed["action"] and failed["result"] == "error"
    assert events(daemon, "kv_entry_removed")[0]["reason"] == "restore_failed"
    assert entries(daemon) == []
    assert restores(daemon, "error").endswith(" 1")


def test_a_restore_the_engine_takes_but_does_not_use_is_found_before_traffic_and_dropped(
    daemon: Daemon,
) -> None:
    other = PROMPT.replace("tool0", "tool9")  # another prompt of as many tokens
    cold = ask(daemon, max_tokens=1)  # one token: the slot then holds the prompt alone
    unload(daemon)
    [entry] = entries(daemon)
    mine = json.loads((entry / "manifest.json").read_text())
    [slot] = mine["slots"]
    ask(daemon, other, max_tokens=1)  # served by a slot of the restored engine, saved at the unload
    unload(daemon)
    [theirs] = [
        s for s in json.loads((entry / "manifest.json").read_text())["slots"] if s["prompt"] != slot["prompt"]
    ]
    assert (theirs["tokens"], theirs["bytes"]) == (slot["tokens"], slot["bytes"])
    # the entry of PROMPT again, its slot file replaced by the other prompt's
    data = (entry / theirs["filename"]).read_bytes()
    for path in entry.glob("slot-*.bin"):
        path.unlink()
    (entry / slot["filename"]).write_bytes(data)
    (entry / "manifest.json").write_text(json.dumps(mine))

    again = ask(daemon, max_tokens=1)  # llama-server restores the slot, but it holds the other prompt
    assert cached(again) == 0
    assert again["choices"][0]["message"] == cold["choices"][0]["message"]
    [failed] = events(daemon, "kv_restore_failed")
    assert failed["result"] == "miss" and "came from the cache" in failed["reason"]
    assert events(daemon, "kv_entry_removed")[-1]["reason"] == "restore_failed"
    assert entries(daemon) == []
    assert restores(daemon, "miss").endswith(" 1") and restores(daemon, "hit").endswith(" 1")


def test_a_cache_survives_a_daemon_restart_is_not_restored_into_another_context_size_and_keeps_to_its_budget(
    daemon: Daemon, llama_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ask(daemon)
    daemon.stop()  # the daemon's shutdown saves the slots
    [first] = entries(daemon)
    size = sum(p.stat().st_size for p in first.iterdir())
    monkeypatch.setenv("MODEL_RUNNER_KV_CACHE_MAX", str(size * 3 // 2))  # room for one entry, not two
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    restarted = Daemon(daemon.home, free_port()).start()
    try:
        resumed = ask(restarted)
        assert cached(resumed) >= resumed["usage"]["prompt_tokens"] - 1
        restarted.cli("configure", "--context-size", "384", "tiny")  # another KV cache: no restore
        other = ask(restarted)
        assert cached(other) == 0
        assert len(events(restarted, "kv_restored")) == 1
        unload(restarted)
        [kept] = entries(restarted)  # the least recently used one made room
        assert kept != first
        assert any(e["reason"] == "budget" for e in events(restarted, "kv_entry_removed"))
    finally:
        restarted.stop()


def test_kv_persist_false_keeps_nothing(daemon: Daemon) -> None:
    daemon.cli("configure", "--kv-persist=false", "tiny")
    ask(daemon)
    unload(daemon)
    assert entries(daemon) == [] and events(daemon, "kv_saved") == []
    assert '"kv-persist": false' in daemon.cli("configure", "show", "tiny").stdout


@contextlib.contextmanager
def inprocess(
    tmp_path: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InProcessDaemon]:
    """The daemon in this process with the real llama-server and `tiny` packaged: its code can be patched."""
    monkeypatch.setenv("MODEL_RUNNER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LLAMA_SERVER_PATH", str(llama_server))
    engine = LlamaCppEngine(install_root=tmp_path / "engines")
    daemon = InProcessDaemon(tmp_path / "home", {"llama.cpp": engine}).start()
    try:
        gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
        assert daemon.http("POST", "/models/package", json={"target": "tiny", "gguf": str(gguf)}).is_success
        yield daemon
    finally:
        daemon.stop()


class Seen(logging.Handler):
    """Sets `flag` when the daemon logs the event named."""

    def __init__(self, event: str, flag: threading.Event) -> None:
        super().__init__()
        self.event, self.flag = event, flag

    def emit(self, record: logging.LogRecord) -> None:
        if self.event in record.getMessage():
            self.flag.set()


def test_a_request_that_comes_while_an_idle_save_is_written_waits_for_it_and_resumes_the_prompt(
    tmp_path: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the idle save's commit is held open until the new runner either waits for it (the fix) or has read
    # the entries without it (the race): a window as wide as the engine's start, whatever the machine
    writing, looked = threading.Event(), threading.Event()
    waits = Seen("kv_restore_waits_for_save", looked)
    commit, entry = KvStore.commit, KvStore.entry

    def held_commit(self: KvStore, *args: Any) -> Any:
        writing.set()
        looked.wait(120)
        return commit(self, *args)

    def entry_read(self: KvStore, *args: Any) -> Any:
        if writing.is_set():
            looked.set()
        return entry(self, *args)

    monkeypatch.setattr(KvStore, "commit", held_commit)
    monkeypatch.setattr(KvStore, "entry", entry_read)
    monkeypatch.setattr(warm, "SAVE_BOUND", 180.0)  # the held save is not cut short on a loaded machine
    logging.getLogger("modelrunner").addHandler(waits)
    try:
        with (
            caplog.at_level(logging.INFO, logger="modelrunner"),
            inprocess(tmp_path, llama_server, monkeypatch) as daemon,
        ):
            cold = ask(daemon, keep_alive="1s")  # idle a second after it: the runner stops, saving its slot
            assert writing.wait(60)
            assert daemon.ps() == []  # out of service while its save is written
            again = ask(daemon)
            assert cached(again) >= again["usage"]["prompt_tokens"] - 1
            assert again["choices"][0]["message"] == cold["choices"][0]["message"]
            [runner] = daemon.ps()
            assert runner["warm"]["state"] == "restored"
            assert any("kv_restore_waits_for_save" in record.getMessage() for record in caplog.records)
    finally:
        logging.getLogger("modelrunner").removeHandler(waits)


def test_a_stuck_engine_is_stopped_without_waiting_for_its_save(
    tmp_path: Path, llama_server: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(warm, "SAVE_BOUND", 1.0)  # how long a save may hold up a stop
    with inprocess(tmp_path, llama_server, monkeypatch) as daemon:
        ask(daemon)
        [runner] = daemon.ps()
        os.kill(runner["pid"], signal.SIGSTOP)  # answers nothing, not even /slots
        with caplog.at_level(logging.INFO, logger="modelrunner"):
            unload(daemon)
        assert daemon.ps() == []
        assert any("kv_save_failed" in record.getMessage() for record in caplog.records)
        assert not list((tmp_path / "home" / "models" / "cache" / "kv").glob("*/*/manifest.json"))


def test_kv_persist_that_is_not_a_boolean_is_refused_and_changes_nothing(daemon: Daemon) -> None:
    before = daemon.cli("configure", "show", "tiny").stdout
    body = {"model": "tiny", "llamacpp": {"kv-persist": "no"}}
    response = daemon.http("POST", "/engines/_configure", json=body)
    assert response.status_code == 400
    assert "kv-persist must be true or false" in response.text
    assert daemon.cli("configure", "show", "tiny").stdout == before
