"""The HTTP front's pool of kept-alive engine connections (server/engine_pool.py), with the scripted
engine on its Unix socket: a connection carries the next request once its answer is complete, and only
then; a request the engine dropped unanswered on a reused connection goes once more on a new one, a cut
answer never does; a client that leaves takes its connection with it; an engine that exits leaves no
connection behind; `Connection: close` is obeyed."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.server import engine_pool
from modelrunner.server.engine_pool import EnginePool
from tests.conformance.dmr_daemons import FakeDaemons
from tests.inprocess import InProcessDaemon

CHAT = "/engines/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}

Start = Callable[..., InProcessDaemon]


@pytest.fixture
def start(tmp_path: Path, fake_daemons: FakeDaemons) -> Start:
    """Starts the in-process daemon with the scripted engine (FAKE_* variables as keywords)."""

    def run(**env: str) -> InProcessDaemon:
        return fake_daemons.start({"FAKE_EVENTS": str(tmp_path / "events"), "FAKE_CHUNKS": "3", **env})

    return run


def events(daemon: InProcessDaemon, name: str) -> list[dict[str, Any]]:
    """The scripted engine's events of that name (its FAKE_EVENTS file, next to the daemon's home)."""
    path = daemon.home.parent / "events"
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in found if e["event"] == name]


def pool(daemon: InProcessDaemon) -> EnginePool:
    assert daemon.daemon is not None
    return daemon.daemon.fast.pool


def idle(daemon: InProcessDaemon) -> int:
    return sum(len(connections) for connections in pool(daemon).idle.values())


def tokens(text: str) -> list[str]:
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    return [c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices")]


def engine_sockets() -> int:
    """This process's Unix stream sockets (the in-process daemon's engine connections among them)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            probe = socket.socket(fileno=int(fd))
        except OSError:
            continue  # not a socket
        try:
            if probe.family == socket.AF_UNIX and probe.type == socket.SOCK_STREAM:
                count += 1
        finally:
            probe.detach()
    return count


def test_a_connection_carries_the_next_request_once_its_answer_is_complete(start: Start) -> None:
    daemon = start()
    for _ in range(3):
        answer = daemon.http("POST", CHAT, json=BODY)
        assert answer.status_code == 200 and tokens(answer.text)[:3] == ["t0 ", "t1 ", "t2 "]
        # it goes back once the relay has ended, which may be after the client has the answer's last byte
        daemon.wait_for(lambda: idle(daemon) == 1, "the connection to go back to the pool")
    assert [e["served"] for e in events(daemon, "request")] == [1, 2, 3]  # one connection for all three


def test_a_reused_connection_the_engine_closes_unanswered_is_retried_once_on_a_new_one(start: Start) -> None:
    daemon = start(FAKE_REUSED="drop")
    first = daemon.http("POST", CHAT, json=BODY)
    assert first.status_code == 200
    daemon.wait_for(lambda: idle(daemon) == 1, "the connection to go back to the pool")
    # the engine closes the kept-alive connection as the second request arrives (its idle timeout, say):
    # nothing was answered, so the front sends it again on a new connection
    second = daemon.http("POST", CHAT, json=BODY)
    assert second.status_code == 200 and tokens(second.text)[:3] == ["t0 ", "t1 ", "t2 "]
    assert [e["served"] for e in events(daemon, "request")] == [1, 2, 1]
    assert len(events(daemon, "reused_closed")) == 1


def test_an_answer_cut_on_a_reused_connection_is_not_sent_again(start: Start) -> None:
    daemon = start(FAKE_REUSED="cut")
    assert daemon.http("POST", CHAT, json=BODY).status_code == 200
    cut = daemon.http("POST", CHAT, json=BODY)
    # the head and one token went to the client: the stream ends with the error event, and the engine got
    # the request once (a generation is not started twice)
    assert cut.status_code == 200 and tokens(cut.text) == ["t0 "]
    assert '"error"' in cut.text.splitlines()[-2]
    assert [e["served"] for e in events(daemon, "request")] == [1, 2]
    assert idle(daemon) == 0
    third = daemon.http("POST", CHAT, json=BODY)
    assert third.status_code == 200 and tokens(third.text)[:3] == ["t0 ", "t1 ", "t2 "]
    assert [e["served"] for e in events(daemon, "request")] == [1, 2, 1]


def test_a_client_that_leaves_mid_answer_takes_the_engine_connection_with_it(start: Start) -> None:
    daemon = start(FAKE_CHUNKS="200", FAKE_CHUNK_DELAY="0.05")
    with httpx.Client(base_url=daemon.url, timeout=30) as client, client.stream("POST", CHAT, json=BODY) as s:
        next(s.iter_lines())  # the first event: the generation runs
    daemon.wait_for(lambda: events(daemon, "cancelled"), "the engine to see its connection close")
    assert idle(daemon) == 0  # never handed to the next request
    daemon.wait_for(lambda: all(r["in_use"] == 0 for r in daemon.ps()), "the runner to be released")
    answer = daemon.http("POST", CHAT, json={**BODY, "max_tokens": 1})
    assert answer.status_code == 200
    assert [e["served"] for e in events(daemon, "request")] == [1, 1]  # a new connection


def test_an_engine_that_exits_leaves_no_pooled_connection_behind(start: Start) -> None:
    before = engine_sockets()
    daemon = start()
    for _ in range(2):
        assert daemon.http("POST", CHAT, json=BODY).status_code == 200
        # back in the pool before the next request: a relay that ends after the client has the answer's
        # last byte would otherwise send the second request on a second connection (two idle, then none)
        daemon.wait_for(lambda: idle(daemon) == 1, "the connection to go back to the pool")
    assert daemon.http("POST", "/engines/unload", json={"all": True}).json() == {"unloaded_runners": 1}
    daemon.wait_for(lambda: idle(daemon) == 0 and not pool(daemon).idle, "the pool to drop the connection")
    daemon.wait_for(lambda: engine_sockets() <= before, "the connection's socket to be closed")
    # the next request loads the model again and opens a new connection
    answer = daemon.http("POST", CHAT, json=BODY)
    assert answer.status_code == 200 and tokens(answer.text)[:3] == ["t0 ", "t1 ", "t2 "]
    assert [e["served"] for e in events(daemon, "request")] == [1, 2, 1]


def test_an_answer_with_connection_close_is_not_kept(start: Start) -> None:
    daemon = start(FAKE_CONNECTION_CLOSE="1")
    for _ in range(2):
        answer = daemon.http("POST", CHAT, json=BODY)
        assert answer.status_code == 200 and tokens(answer.text)[:3] == ["t0 ", "t1 ", "t2 "]
        assert answer.headers.get("connection") != "close"  # the engine's hop-by-hop header stays there
        assert idle(daemon) == 0
    assert [e["served"] for e in events(daemon, "request")] == [1, 1]


def test_an_engine_that_closes_after_each_answer_gets_no_request_on_a_closing_connection(
    start: Start,
) -> None:
    # llama-server's stream heads say `Keep-Alive`, and it closes the connection after each stream. Here
    # it closes 1 s after the stream, so the second request takes the connection back from the pool and
    # is dropped unread with it (then sent again on a new one); from then on the pool keeps none of that
    # engine's connections, and no request goes out on one that is closing.
    daemon = start(FAKE_CLOSE_AFTER_STREAM="1")  # time for the next request to come, on a loaded machine
    for _ in range(4):
        answer = daemon.http("POST", CHAT, json=BODY)
        assert answer.status_code == 200 and tokens(answer.text)[:3] == ["t0 ", "t1 ", "t2 "]
    assert [e["served"] for e in events(daemon, "request")] == [1] * 4
    daemon.wait_for(lambda: events(daemon, "dropped_unread"), "the engine to drop the second request")
    time.sleep(1.5)  # the last connection closes too
    assert len(events(daemon, "dropped_unread")) == 1  # the second request's first send, no other
    assert len(pool(daemon).not_kept) == 1


def test_an_engine_that_keeps_no_connection_gets_the_next_one_opened_ahead(start: Start) -> None:
    # Once the pool knows the engine closes its connections, each request that goes out opens the next
    # request's connection (a spare): that request finds it open and waits for no connect.
    daemon = start(FAKE_CLOSE_AFTER_STREAM="0")
    for _ in range(4):
        answer = daemon.http("POST", CHAT, json=BODY)
        assert answer.status_code == 200 and tokens(answer.text)[:3] == ["t0 ", "t1 ", "t2 "]
        time.sleep(0.3)
    waited = [e["waited"] for e in events(daemon, "request")]
    assert waited[:2] == pytest.approx([0, 0], abs=0.25)  # each connected for its request (0.3 s apart)
    assert all(0.3 <= seconds < engine_pool.MAX_IDLE_SECONDS for seconds in waited[2:]), waited
    assert idle(daemon) == 1 and not events(daemon, "dropped_unread")  # the fifth request's spare
    daemon.wait_for(lambda: idle(daemon) == 0, "the unused spare to be closed", timeout=5)


def test_a_spare_connection_the_engine_closes_unanswered_is_retried_once_on_a_new_one(start: Start) -> None:
    # the engine closes a connection whose request comes more than 0.5 s after it was opened (as an
    # engine's idle timeout would): the spare, 1 s old, carries nothing, and the request goes again
    daemon = start(FAKE_CLOSE_AFTER_STREAM="0", FAKE_DROP_WAITED="0.5")
    for _ in range(3):
        answer = daemon.http("POST", CHAT, json=BODY)
        assert answer.status_code == 200 and tokens(answer.text)[:3] == ["t0 ", "t1 ", "t2 "]
        time.sleep(1)
    assert len(events(daemon, "waited_closed")) == 1  # the third request's spare
    assert [e["served"] for e in events(daemon, "request")] == [1, 1, 1, 1]
    assert len(events(daemon, "completed")) == 3


def test_a_runner_being_stopped_has_its_idle_connections_closed_at_once(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama-server waits for its open connections before it exits: the pool must not hold one until then
    monkeypatch.setattr(engine_pool, "MAX_IDLE_SECONDS", 600.0)  # the pool's own idle timeout plays no part
    daemon = start(FAKE_STOP_DELAY="3")
    assert daemon.http("POST", CHAT, json=BODY).status_code == 200
    daemon.wait_for(lambda: idle(daemon) == 1, "the connection to go back to the pool")
    unloading = threading.Thread(target=lambda: daemon.http("POST", "/engines/unload", json={"all": True}))
    unloading.start()
    daemon.wait_for(lambda: not pool(daemon).idle, "the pool to close the connection")
    assert not events(daemon, "exiting")  # while the engine still runs (its SIGTERM handler waits)
    unloading.join(30)
    daemon.wait_for(lambda: events(daemon, "exiting"), "the engine to exit")
