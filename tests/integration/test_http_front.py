"""The HTTP front (server/front.py) on a real port, with the scripted engine: which requests it answers,
keep-alive and the hand-over of a connection to uvicorn, pipelining, split requests, graceful shutdown."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelrunner.server import front, handed_over
from modelrunner.server.inference import InferenceHandler
from modelrunner.server.native_relay import NativeRelay
from tests.conformance.dmr_daemons import FakeDaemons
from tests.inprocess import InProcessDaemon
from tests.response_bodies import unchunked
from tests.waiting import wait_until

CHAT = "/engines/v1/chat/completions"


@pytest.fixture
def asgi_inference_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths of the inference requests the ASGI stack answered (the front answers the others)."""
    calls: list[str] = []
    original = InferenceHandler.__call__

    async def counted(self: InferenceHandler, scope: Any, receive: Any, send: Any, route: Any) -> None:
        calls.append(scope["path"])
        await original(self, scope, receive, send, route)

    monkeypatch.setattr(InferenceHandler, "__call__", counted)
    return calls


@contextlib.contextmanager
def serving_tiny(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine_env: dict[str, str]
) -> Iterator[InProcessDaemon]:
    """An in-process daemon whose llama.cpp is the scripted engine (`engine_env`), the tiny model packaged
    as `tiny`; stopped at the end."""
    daemons = FakeDaemons(tmp_path, monkeypatch)
    try:
        yield daemons.start(engine_env)
    finally:
        daemons.stop_all()


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessDaemon]:
    with serving_tiny(tmp_path, monkeypatch, {"FAKE_CHUNKS": "3"}) as running:
        yield running


def body(stream: bool) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def contents(text: str) -> list[str]:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    return [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"] and c["choices"][0]["delta"]]


def test_plain_requests_go_to_the_front_and_a_handed_over_connection_stays_with_uvicorn(
    daemon: InProcessDaemon, asgi_inference_calls: list[str]
) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:  # one keep-alive connection
        streamed = client.post(CHAT, json=body(True))
        assert streamed.status_code == 200 and contents(streamed.text) == ["t0 ", "t1 ", "t2 "]
        assert streamed.headers["cache-control"] == "no-cache" and "date" in streamed.headers
        answered = client.post("/v1/chat/completions", json=body(False))
        # asked for as a stream and assembled (server/served_call.py): the fake engine's streamed tokens
        assert answered.json()["choices"][0]["message"]["content"] == "t0 t1 t2 "
        assert asgi_inference_calls == []  # both answered by the front, on one connection
        assert client.get("/models").status_code == 200  # not inference: the connection goes to uvicorn
        again = client.post(CHAT, json=body(True))
        assert again.status_code == 200 and contents(again.text) == ["t0 ", "t1 ", "t2 "]
        assert asgi_inference_calls == [CHAT]
    cors = daemon.http("POST", CHAT, json=body(False), headers={"origin": "http://localhost:3000"})
    assert cors.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert asgi_inference_calls == [CHAT, CHAT]  # a browser's request: the middleware decides


class _Reader:
    """Lets http.client read several responses from one buffered socket file (it closes the file after
    each response, hence a file that stays open)."""

    def __init__(self, sock: socket.socket) -> None:
        self.file = _Unclosed(socket.SocketIO(sock, "rb"))

    def makefile(self, mode: str) -> io.BufferedReader:
        return self.file


class _Unclosed(io.BufferedReader):
    def close(self) -> None:
        pass


def raw_request(path: str, payload: dict[str, Any], extra: bytes = b"") -> bytes:
    data = json.dumps(payload).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    return head.encode() + extra + b"Content-Length: %d\r\n\r\n" % len(data) + data


def test_pipelined_and_split_requests_are_answered_in_order(daemon: InProcessDaemon) -> None:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        reader = _Reader(sock)
        sock.sendall(raw_request(CHAT, body(False)) + raw_request(CHAT, body(True)))
        first = http.client.HTTPResponse(reader)  # type: ignore[arg-type]
        first.begin()
        assert first.status == 200 and json.loads(first.read())["object"] == "chat.completion"
        second = http.client.HTTPResponse(reader)  # type: ignore[arg-type]
        second.begin()
        assert second.status == 200 and second.getheader("transfer-encoding") == "chunked"
        assert contents(second.read().decode()) == ["t0 ", "t1 ", "t2 "]

        request = raw_request(CHAT, body(False))
        for piece in (request[:20], request[20:-5], request[-5:]):  # the head and body in pieces
            sock.sendall(piece)
            time.sleep(0.05)
        third = http.client.HTTPResponse(reader)  # type: ignore[arg-type]
        third.begin()
        assert third.status == 200 and json.loads(third.read())["object"] == "chat.completion"

        sock.sendall(raw_request(CHAT, {"messages": []}, b"Connection: close\r\n"))
        refused = http.client.HTTPResponse(reader)  # type: ignore[arg-type]
        refused.begin()
        assert refused.status == 400 and "model" in json.loads(refused.read())["error"]["message"]
        assert refused.getheader("connection") == "close"
        assert sock.recv(1) == b""  # closed, as asked


def test_a_stopping_daemon_finishes_the_stream_in_progress(fake_daemons: FakeDaemons) -> None:
    daemon = fake_daemons.start({"FAKE_CHUNKS": "10", "FAKE_CHUNK_DELAY": "0.1"})
    with httpx.stream("POST", daemon.url + CHAT, json=body(True), timeout=30) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        stopper = threading.Thread(target=daemon.stop)
        stopper.start()
        rest = list(lines)
    stopper.join()
    assert [line for line in rest if line.startswith("data: ")][-1] == "data: [DONE]"


@pytest.mark.parametrize("native", ["1", "0"])
def test_streams_go_through_the_c_relay_unless_switched_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    # After the head and the first chunk, a chunked stream is relayed by the C thread
    # (server/native_relay.py); MODEL_RUNNER_NATIVE_RELAY=0 keeps every chunk in Python. Either way: the
    # same answer, the same record.
    monkeypatch.setenv("MODEL_RUNNER_NATIVE_RELAY", native)
    added: list[int] = []
    original = NativeRelay.add

    def counted(self: NativeRelay, *args: Any) -> int:
        added.append(original(self, *args))
        return added[-1]

    monkeypatch.setattr(NativeRelay, "add", counted)
    with serving_tiny(tmp_path, monkeypatch, {"FAKE_CHUNKS": "40", "FAKE_CHUNK_DELAY": "0.005"}) as running:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            for _ in range(3):  # on one connection, and one engine connection from the pool
                streamed = client.post(CHAT, json=body(True))
                assert contents(streamed.text) == [f"t{i} " for i in range(40)]
        assert len(added) == (3 if native == "1" else 0)

        def finished() -> list[dict[str, Any]]:  # a record is finished after the client has the last byte
            (entry,) = running.http("GET", "/engines/requests?model=tiny").json()
            assert entry["count"] == 3
            return entry["records"] if all(r["status_code"] for r in entry["records"]) else []

        for record in wait_until(finished, "the three records to be finished"):
            assert record["status_code"] == 200
            answer = json.loads(record["response"])  # the stream, reassembled whole (server/recorder.py)
            assert answer["choices"][0]["message"]["content"] == "".join(f"t{i} " for i in range(40))


def test_a_stream_the_c_relay_cannot_take_is_relayed_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(self: NativeRelay, *args: Any) -> int:
        raise OSError(24, "Too many open files")  # os.dup at the descriptor limit

    monkeypatch.setattr(NativeRelay, "add", refused)
    with serving_tiny(tmp_path, monkeypatch, {"FAKE_CHUNKS": "20"}) as running:
        streamed = running.http("POST", CHAT, json=body(True))
        assert contents(streamed.text) == [f"t{i} " for i in range(20)]


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_client_that_stops_reading_holds_the_engine_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    # ~15 MB of stream, far beyond the sockets' buffers: while the client reads nothing the engine must
    # stop (its writes block), not the daemon buffer the answer; then every chunk arrives, in order.
    monkeypatch.setenv("MODEL_RUNNER_NATIVE_RELAY", native)
    events = tmp_path / "events"
    chunks, pad = 5000, 3000
    env = {"FAKE_CHUNKS": str(chunks), "FAKE_CHUNK_PAD": str(pad), "FAKE_EVENTS": str(events)}

    def tokens() -> int:
        return events.read_text().count('"token"')

    with serving_tiny(tmp_path, monkeypatch, env) as running, socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.settimeout(60)
        sock.connect(("127.0.0.1", running.port))
        sock.sendall(raw_request(CHAT, body(True)))
        answer = bytearray(sock.recv(4096))
        wait_until(tokens, "the engine's first tokens")
        deadline = time.monotonic() + 30
        while True:  # the engine runs until the buffers on the way are full, then waits (2 s unchanged)
            before = tokens()
            time.sleep(2)
            if tokens() == before or time.monotonic() > deadline:
                break
        assert 0 < tokens() == before < chunks
        while not answer.endswith(b"\r\n0\r\n\r\n"):
            data = sock.recv(1 << 20)
            assert data, "the stream ended early"
            answer += data
    head, _, framed = bytes(answer).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    assert contents(unchunked(framed).decode()) == [f"t{i} " + "x" * pad for i in range(chunks)]


def ended_with_error(text: str, reason: str) -> None:
    """A stream the daemon ended for its engine: the chunks sent, then OpenAI's stream error event (the
    stream's end, properly framed: httpx read it whole)."""
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    error = json.loads(events[-1])["error"]
    assert error["type"] == "server_error" and reason in error["message"], error
    assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1]) and len(events) > 1


def released_and_unloaded(running: InProcessDaemon) -> None:
    deadline = time.monotonic() + 30
    while any(r["in_use"] for r in running.http("GET", "/engines/ps").json()):
        assert time.monotonic() < deadline, "the runner was not released"
        time.sleep(0.05)
    assert running.http("POST", "/engines/unload", json={"all": True}).json() == {"unloaded_runners": 1}


# the front relays in Python ("0") or hands the body to the C relay ("1"); a request with an Origin goes
# to the ASGI stack (server/served_call.py reads the engine there)
RELAYS = [("1", None), ("0", None), ("1", "http://localhost:3000")]


# An engine that stops sending (it still answers /health: only its silence in the middle of the stream
# tells), or that sends invalid framing: the stream ends with the error event, the runner is released.
# The idle limit (2 s) is only the silent engine's: a slow machine's pause is not taken for silence.
ENGINE_FAULTS = {
    "silent": ({"FAKE_STALL_AFTER": "3"}, "the engine sent nothing for 2 seconds"),
    "invalid framing": ({"FAKE_BAD_CHUNK_AFTER": "3"}, "invalid chunk size"),
}


@pytest.mark.parametrize("fault", ENGINE_FAULTS)
@pytest.mark.parametrize(("native", "origin"), RELAYS)
def test_an_engine_that_stops_sending_or_breaks_its_framing_ends_the_stream_with_an_error_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str, origin: str | None, fault: str
) -> None:
    engine_env, reason = ENGINE_FAULTS[fault]
    monkeypatch.setenv("MODEL_RUNNER_NATIVE_RELAY", native)
    if fault == "silent":
        monkeypatch.setenv("MODEL_RUNNER_ENGINE_IDLE_TIMEOUT", "2")
    with serving_tiny(tmp_path, monkeypatch, {"FAKE_CHUNKS": "10", **engine_env}) as running:
        headers = {"origin": origin} if origin else {}
        streamed = running.http("POST", CHAT, json=body(True), headers=headers)
        assert streamed.status_code == 200
        ended_with_error(streamed.text, reason)
        released_and_unloaded(running)


def read_to_the_end(sock: socket.socket) -> tuple[bytes, bytes]:
    """The answer's head and body, read until the daemon closes the connection."""
    answer = b""
    while data := sock.recv(1 << 16):
        answer += data
    head, _, rest = answer.partition(b"\r\n\r\n")
    return head, rest


ORIGIN = b"Origin: http://localhost:3000\r\n"  # the front hands such a request to the ASGI stack


@pytest.mark.parametrize(("native", "extra"), [("1", b""), ("0", b""), ("1", ORIGIN)])
def test_a_client_that_shuts_its_side_after_asking_for_a_stream_gets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str, extra: bytes
) -> None:
    monkeypatch.setenv("MODEL_RUNNER_NATIVE_RELAY", native)
    with serving_tiny(tmp_path, monkeypatch, {"FAKE_CHUNKS": "20"}) as running:
        for path, payload in [(CHAT, body(True)), ("/api/chat", {**body(True), "stream": None})]:
            if "stream" in payload and payload["stream"] is None:
                del payload["stream"]  # Ollama streams unless told not to
            with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
                sock.sendall(raw_request(path, payload, extra))
                sock.shutdown(socket.SHUT_WR)  # a half-close: the answer is still wanted
                head, framed = read_to_the_end(sock)
            assert head.startswith(b"HTTP/1.1 200") and framed.endswith(b"0\r\n\r\n"), (head, framed[-200:])
            text = unchunked(framed).decode()
            if path == CHAT:
                assert contents(text) == [f"t{i} " for i in range(20)]
            else:
                lines = [json.loads(line) for line in text.splitlines()]
                assert "".join(line["message"]["content"] for line in lines) == "".join(
                    f"t{i} " for i in range(20)
                )
                assert lines[-1]["done"] is True


def test_without_the_front_a_stalled_body_is_answered_408_too(
    fake_daemons: FakeDaemons, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MODEL_RUNNER_FAST_PATH=0 (and the Unix socket and TLS listeners) serve with the same protocol the
    front hands connections to (server/daemon.py), so the same limit holds there."""
    monkeypatch.setattr(handed_over, "REQUEST_STALL_SECONDS", 0.5)
    running = fake_daemons.start(front=False, models=())
    with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
        sock.sendall(raw_request(CHAT, body(False))[:-10])
        head, answer = read_to_the_end(sock)
    assert head.startswith(b"HTTP/1.1 408") and json.loads(answer)["error"]["message"] == handed_over.STALLED


@pytest.mark.parametrize("extra", [b"", ORIGIN])
def test_a_local_client_that_shuts_its_side_after_asking_for_a_whole_answer_gets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: bytes
) -> None:
    """On the front and on the ASGI stack: a client on this machine that still holds its socket after EOF
    half-closed (server/handed_over.py); it gets the whole answer."""
    monkeypatch.setattr(handed_over, "HALF_CLOSE_CHECK_SECONDS", 0.05)
    with serving_tiny(tmp_path, monkeypatch, {"FAKE_CHUNKS": "20", "FAKE_CHUNK_DELAY": "0.02"}) as running:
        for path, payload in [(CHAT, body(False)), ("/api/chat", body(False))]:
            with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
                sock.sendall(raw_request(path, payload, extra))
                sock.shutdown(socket.SHUT_WR)  # a half-close: the answer is still wanted
                head, answer = read_to_the_end(sock)
            assert head.startswith(b"HTTP/1.1 200"), (head, answer[-200:])
            document = json.loads(unchunked(answer) if b"chunked" in head.lower() else answer)
            text = (
                document["choices"][0]["message"]["content"]
                if path == CHAT
                else document["message"]["content"]
            )
            assert text == "".join(f"t{i} " for i in range(20))


@pytest.mark.parametrize("extra", [b"", ORIGIN])
def test_a_half_closed_client_that_then_closes_has_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: bytes
) -> None:
    """Its socket let go while its whole answer is made: the engine's work stops and the runner is free,
    as for any client that leaves."""
    monkeypatch.setattr(handed_over, "HALF_CLOSE_CHECK_SECONDS", 0.05)
    with serving_tiny(
        tmp_path, monkeypatch, {"FAKE_CHUNKS": "100000", "FAKE_CHUNK_DELAY": "0.01"}
    ) as running:
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
            sock.sendall(raw_request(CHAT, body(False), extra))
            sock.shutdown(socket.SHUT_WR)
            running.wait_for(lambda: any(r["in_use"] for r in running.ps()), "the request to hold its runner")
        released_and_unloaded(running)


@pytest.mark.parametrize(
    ("path", "extra"), [(CHAT, b""), (CHAT, ORIGIN), ("/models/create", b""), ("/api/chat", b"")]
)
def test_a_request_whose_body_stops_coming_is_answered_408(
    daemon: InProcessDaemon, monkeypatch: pytest.MonkeyPatch, path: str, extra: bytes
) -> None:
    # on the front (CHAT) and on the ASGI stack (a browser's request, management and Ollama routes)
    monkeypatch.setattr(front, "REQUEST_STALL_SECONDS", 0.5)
    monkeypatch.setattr(handed_over, "REQUEST_STALL_SECONDS", 0.5)
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        request = raw_request(path, body(False), extra)
        sock.sendall(request[:-10])  # the head says how long the body is; its last bytes never come
        head, answer = read_to_the_end(sock)
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
    assert json.loads(answer)["error"]["message"] == handed_over.STALLED
