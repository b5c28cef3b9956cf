"""A silent prefill is never a silent stream, and a client that leaves is let go at once (issue 34); requests
that left the queue do not keep their place (issue 36 item 6).

The engine is the scripted one (tests/fake_engine.py) as llama.cpp: its streams send their head, then
nothing for FAKE_FIRST_CHUNK_DELAY seconds, as llama-server does while it prefills; it notes when it sees
its connection closed during that silence (`prefill_cancelled`) or between tokens (`cancelled`), with the
time. Every API family is tried, on each relay that serves it. A client here reads all that came before it
closes (a socket closed with unread bytes is reset, which any relay notices; a client that read its
answer so far sends a FIN, which only the daemon's watch of the client's side notices before a write).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from modelrunner.server import keepalive
from tests.conformance.dmr_daemons import FakeDaemons, fake_daemons_under
from tests.inprocess import InProcessDaemon
from tests.waiting import wait_until

HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
ORIGIN = b"Origin: http://localhost:3000\r\n"  # the front hands such a request to the ASGI stack
# every API family, on each relay that serves it: (id, path, body, extra header lines)
ROUTES: list[tuple[str, str, dict[str, Any], bytes]] = [
    ("openai-chat-front", "/v1/chat/completions", {"messages": HI}, b""),
    ("openai-chat-asgi", "/v1/chat/completions", {"messages": HI}, ORIGIN),
    ("openai-chat-tools", "/v1/chat/completions", {"messages": HI, "tools": TOOLS}, b""),
    ("openai-completions", "/v1/completions", {"prompt": "hi"}, b""),
    ("anthropic", "/anthropic/v1/messages", {"messages": HI, "max_tokens": 8}, b""),
    ("responses", "/v1/responses", {"input": "hi"}, b""),
    ("ollama-chat", "/api/chat", {"messages": HI}, b""),
    ("ollama-generate", "/api/generate", {"prompt": "hi"}, b""),
]
ROUTE_IDS = [route[0] for route in ROUTES]
PINGS = {  # each API's keep-alive, as it is on the wire
    "anthropic": keepalive.ANTHROPIC_PING,
    "ollama-chat": b'"message": {"role": "assistant", "content": ""}, "done": false}\n',
    "ollama-generate": b'"response": "", "done": false}\n',
}


def raw_request(path: str, body: dict[str, Any], extra: bytes = b"") -> bytes:
    data = json.dumps({"model": "tiny", **body}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
    return head + extra + b"Content-Length: %d\r\n\r\n" % len(data) + data


def events(path: Path, name: str) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["event"] == name]


def drain(sock: socket.socket) -> bytes:
    """What the daemon sent so far, read without waiting."""
    sock.setblocking(False)
    received = b""
    with contextlib.suppress(BlockingIOError):
        while data := sock.recv(65536):
            received += data
    return received


# -- keep-alives through a prefill ---------------------------------------------------------------------


@pytest.fixture
def pinging(fake_daemons: FakeDaemons, monkeypatch: pytest.MonkeyPatch) -> InProcessDaemon:
    """Pings every 0.2 s; the model loads for 0.6 s (the streams' heads go out early, with pings), then
    each stream's engine is silent for 2 s after its head (a prefill): the engine's head is a seam between
    the early head's pings and the stream's."""
    monkeypatch.setenv(keepalive.ENV, "0.2")
    env = {"FAKE_START_DELAY": "0.6", "FAKE_FIRST_CHUNK_DELAY": "2", "FAKE_TEXT": "hello there"}
    return fake_daemons.start(env)


@pytest.mark.parametrize(("case", "path", "body", "extra"), ROUTES, ids=ROUTE_IDS)
def test_a_silent_prefill_is_pinged_through_on_every_api(
    pinging: InProcessDaemon, case: str, path: str, body: dict[str, Any], extra: bytes
) -> None:
    """No silence as long as the prefill (2 s): before, the ASGI relay's OpenAI streams and Ollama's were
    silent from the engine's head to its first token."""
    with socket.create_connection(("127.0.0.1", pinging.port), timeout=30) as sock:
        sent = time.monotonic()
        sock.sendall(raw_request(path, {**body, "stream": True}, extra))
        reads, received = [sent], b""
        while b"hello t" not in received:  # the engine's first piece of text
            data = sock.recv(65536)
            assert data, received
            reads.append(time.monotonic())
            received += data
        received += drain(sock)
    assert received.startswith(b"HTTP/1.1 200")
    ping = PINGS.get(case, keepalive.SSE_COMMENT)
    assert received.partition(b"hello t")[0].count(ping) >= 4, received  # ~13 at one every 0.2 s
    largest = max(later - earlier for earlier, later in itertools.pairwise(reads))
    assert largest < 1.0, f"{case}: {largest:.2f} s without a byte"


@pytest.mark.parametrize("kind", ["chat", "generate"])
def test_the_ollama_client_reads_a_pinged_stream(pinging: InProcessDaemon, kind: str) -> None:
    """Ollama's ping is a line with no text: the `ollama` client parses every line (an empty one would fail
    it) and adds nothing to the answer."""
    client = ollama.Client(host=pinging.url)
    if kind == "chat":
        parts = [p.message.content or "" for p in client.chat(model="tiny", messages=HI, stream=True)]
    else:
        parts = [p.response or "" for p in client.generate(model="tiny", prompt="hi", stream=True)]
    assert "".join(parts) == "hello there"
    assert parts.count("") >= 4  # the pings, read as pieces with no text


# -- a client that leaves ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefilling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessDaemon, Path]]:
    """Each stream's engine is silent for 30 s after its head; pings at the default 10 s: before the fix,
    a stream's client that left was noticed at the second ping's failed write (~19 s)."""
    folder = tmp_path_factory.mktemp("prefill")
    log = folder / "events.jsonl"
    with fake_daemons_under(folder) as daemons:
        daemons.monkeypatch.setenv(keepalive.ENV, "10")
        yield daemons.start({"FAKE_FIRST_CHUNK_DELAY": "30", "FAKE_EVENTS": str(log)}), log


@pytest.fixture(scope="module")
def generating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessDaemon, Path]]:
    """Each stream's engine sends a first token, then is silent for 30 s."""
    folder = tmp_path_factory.mktemp("generation")
    log = folder / "events.jsonl"
    with fake_daemons_under(folder) as daemons:
        daemons.monkeypatch.setenv(keepalive.ENV, "10")
        env = {"FAKE_CHUNKS": "3", "FAKE_CHUNK_DELAY": "30", "FAKE_EVENTS": str(log)}
        yield daemons.start(env), log


def leave_and_time_the_cancel(
    daemon: InProcessDaemon, log: Path, path: str, body: dict[str, Any], extra: bytes, closed_event: str
) -> float:
    """Ask, wait until the engine has the request (and, during generation, the client its first token),
    read what came, close; the seconds until the engine saw its connection closed."""
    requests, cancels = len(events(log, "request")), len(events(log, closed_event))
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        sock.sendall(raw_request(path, body, extra))
        wait_until(lambda: len(events(log, "request")) > requests, "the engine to get the request")
        if closed_event == "cancelled":  # generating: the first token is out
            wait_until(lambda: events(log, "token")[-1:] and sock.recv(65536, socket.MSG_PEEK), "a token")
        time.sleep(0.2)
        drain(sock)
        closed = time.time()
    found = wait_until(lambda: events(log, closed_event)[cancels:], "the engine to see its connection close")
    return float(found[0]["at"]) - closed


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(("case", "path", "body", "extra"), ROUTES, ids=ROUTE_IDS)
def test_a_client_that_leaves_during_the_prefill_cancels_it_at_once(
    prefilling: tuple[InProcessDaemon, Path],
    case: str,
    path: str,
    body: dict[str, Any],
    extra: bytes,
    stream: bool,
) -> None:
    daemon, log = prefilling
    seconds = leave_and_time_the_cancel(
        daemon, log, path, {**body, "stream": stream}, extra, "prefill_cancelled"
    )
    assert seconds < 1.0, f"{case}: the engine saw the client's close {seconds:.2f} s later"
    daemon.wait_for(lambda: not any(r["in_use"] for r in daemon.ps()), "the runner to be released")


@pytest.mark.parametrize(("case", "path", "body", "extra"), ROUTES, ids=ROUTE_IDS)
def test_a_client_that_leaves_between_tokens_cancels_at_once(
    generating: tuple[InProcessDaemon, Path], case: str, path: str, body: dict[str, Any], extra: bytes
) -> None:
    daemon, log = generating
    seconds = leave_and_time_the_cancel(daemon, log, path, {**body, "stream": True}, extra, "cancelled")
    assert seconds < 1.0, f"{case}: the engine saw the client's close {seconds:.2f} s later"
    daemon.wait_for(lambda: not any(r["in_use"] for r in daemon.ps()), "the runner to be released")


# -- the queue -----------------------------------------------------------------------------------------


def queue_depth(daemon: InProcessDaemon) -> int:
    for line in daemon.http("GET", "/metrics").text.splitlines():
        if line.startswith("modelrunner_queue_depth "):
            return int(float(line.split()[1]))
    raise AssertionError("no queue depth in /metrics")


def busy_one(
    daemon: InProcessDaemon, pool: concurrent.futures.ThreadPoolExecutor
) -> concurrent.futures.Future[httpx.Response]:
    """Model `one` answers a stream: with one runner slot, every request for another model waits."""
    body = {"model": "one", "messages": HI, "stream": True}
    busy = pool.submit(daemon.http, "POST", "/v1/chat/completions", json=body)
    daemon.wait_for(lambda: any(r["in_use"] for r in daemon.ps()), "model one to be busy")
    return busy


@pytest.fixture
def one_slot(fake_daemons: FakeDaemons, tmp_path: Path) -> tuple[InProcessDaemon, Path]:
    log = tmp_path / "events.jsonl"
    # each stream: 12 s, time enough for 16 requests to queue and leave on a loaded machine (4 s was not: CI)
    env = {"FAKE_CHUNKS": "120", "FAKE_CHUNK_DELAY": "0.1", "FAKE_EVENTS": str(log)}
    return fake_daemons.start(env, models=("one", "two"), max_runners=1), log


def test_queued_clients_that_leave_free_their_place_at_once(one_slot: tuple[InProcessDaemon, Path]) -> None:
    """Streamed or not, on every API: the queue empties as they leave, while model one is still busy, and
    model two is never loaded for them."""
    daemon, log = one_slot
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = busy_one(daemon, pool)
        socks = []
        for (_, path, body, extra), stream in itertools.product(ROUTES, (True, False)):
            sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
            sock.sendall(raw_request(path, {**body, "model": "two", "stream": stream}, extra))
            socks.append(sock)
        daemon.wait_for(lambda: queue_depth(daemon) == len(socks), "every request to queue")
        for sock in socks:
            drain(sock)
            sock.close()
        daemon.wait_for(lambda: queue_depth(daemon) == 0, "the queue to empty")
        assert not busy.done()  # they left the queue themselves: nothing was served meanwhile
        assert busy.result().status_code == 200
    time.sleep(0.5)  # model one idle: a request still queued would now load model two
    assert [r["model_name"] for r in daemon.ps()] == ["one"] and len(events(log, "started")) == 1


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/v1/chat/completions", {"messages": HI}, "openai"),
        ("/api/chat", {"messages": HI, "stream": False}, "ollama"),
        ("/anthropic/v1/messages", {"messages": HI, "max_tokens": 8}, "anthropic"),
    ],
)
def test_a_queue_wait_is_bounded(
    fake_daemons: FakeDaemons, path: str, body: dict[str, Any], shape: str
) -> None:
    env = {"FAKE_CHUNKS": "40", "FAKE_CHUNK_DELAY": "0.1"}
    daemon = fake_daemons.start(env, models=("one", "two"), max_runners=1, queue_timeout=0.5)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        busy = busy_one(daemon, pool)
        refused = daemon.http("POST", path, json={**body, "model": "two"})
        assert not busy.done()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    error = refused.json()
    message = error["error"] if shape == "ollama" else error["error"]["message"]
    assert "MODEL_RUNNER_QUEUE_TIMEOUT" in message
    if shape == "anthropic":
        assert error["type"] == "error"


def test_the_queue_is_first_come_first_served_across_models(one_slot: tuple[InProcessDaemon, Path]) -> None:
    """A request for the busy model that comes after one for another model waits behind it: before, it
    was served at once, and a model kept busy starved the others."""
    daemon, _ = one_slot
    finished: list[str] = []

    def ask(name: str, model: str) -> None:
        response = daemon.http("POST", "/v1/chat/completions", json={"model": model, "messages": HI})
        assert response.status_code == 200, response.text
        finished.append(name)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        busy = busy_one(daemon, pool)
        two = pool.submit(ask, "two", "two")
        daemon.wait_for(lambda: queue_depth(daemon) == 1, "model two's request to queue")
        again = pool.submit(ask, "one again", "one")
        daemon.wait_for(lambda: queue_depth(daemon) == 2, "the second request for model one to queue")
        for future in (busy, two, again):
            future.result()
    assert finished == ["two", "one again"]


def test_a_request_cancelled_in_the_queue_lets_the_next_go(one_slot: tuple[InProcessDaemon, Path]) -> None:
    """The first in line leaves: the one behind it is served as soon as there is room."""
    daemon, _ = one_slot
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = busy_one(daemon, pool)
        first = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
        first.sendall(raw_request("/v1/chat/completions", {"model": "two", "messages": HI}))
        daemon.wait_for(lambda: queue_depth(daemon) == 1, "the first to queue")
        body = {"model": "two", "messages": HI}
        second = pool.submit(daemon.http, "POST", "/api/chat", json={**body, "stream": False})
        daemon.wait_for(lambda: queue_depth(daemon) == 2, "the second to queue")
        first.close()
        daemon.wait_for(lambda: queue_depth(daemon) == 1, "the first to leave")
        assert busy.result().status_code == 200
        assert second.result().status_code == 200


@pytest.mark.parametrize("phase", ["prefill", "generation"])
def test_the_python_relay_lets_a_client_go_at_once_too(
    prefilling: tuple[InProcessDaemon, Path],
    generating: tuple[InProcessDaemon, Path],
    monkeypatch: pytest.MonkeyPatch,
    phase: str,
) -> None:
    """The front relays in Python where the C relay is off (or not built): the same."""
    monkeypatch.setenv("MODEL_RUNNER_NATIVE_RELAY", "0")
    daemon, log = prefilling if phase == "prefill" else generating
    closed_event = "prefill_cancelled" if phase == "prefill" else "cancelled"
    body = {"messages": HI, "stream": True}
    seconds = leave_and_time_the_cancel(daemon, log, "/v1/chat/completions", body, b"", closed_event)
    assert seconds < 1.0, f"the engine saw the client's close {seconds:.2f} s later"
    daemon.wait_for(lambda: not any(r["in_use"] for r in daemon.ps()), "the runner to be released")
