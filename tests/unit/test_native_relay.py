"""The C relay (modelrunner/_relay.c through server/native_relay.py) on socket pairs: it follows chunked
framing exactly as the one Python response reader does (modelrunner/response_reader.py, the oracle here),
whatever the reads (one table of size lines for both, tests/chunk_lines.py), keeps the recorder's head and
tail, holds the engine back while the client does not read, and ends each stream once: complete, engine
closed, invalid, client gone, engine idle or cancelled."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Callable

import pytest

from modelrunner.chunking import chunk_size
from modelrunner.response_reader import ResponseReader
from modelrunner.server import native_relay as native
from modelrunner.server.native_relay import End, Result
from tests.chunk_lines import SIZE_LINES
from tests.response_bodies import chunked_reader


def test_the_extension_is_built() -> None:
    # The install builds it (setup.py) where a C compiler and Python's headers are found; without it the
    # front relays in Python, several times slower per chunk (bench/RESULTS.md, ## relay).
    # native_relay imports the extension (or None) without re-exporting it; its own name is what is checked
    built = native._relay  # type: ignore[attr-defined]
    assert built is not None, "modelrunner._relay was not built: install a C compiler, rerun setup"


def chunked(pieces: list[bytes], trailers: bytes = b"") -> bytes:
    out = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces)
    return out + b"0\r\n" + trailers + b"\r\n"


def events(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [b'data: {"i":%d,"t":"%s"}\n\n' % (i, b"x" * rng.randint(0, 300)) for i in range(count)]


class Pair:
    """An engine and a client, each a socket pair whose far end the relay gets."""

    def __init__(self) -> None:
        self.engine, engine_far = socket.socketpair()
        self.client, client_far = socket.socketpair()
        for s in (engine_far, client_far):
            s.setblocking(False)
        self.far = (client_far, engine_far)

    def close(self) -> None:
        for s in (self.engine, self.client, *self.far):
            s.close()

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def relay(
    act: Callable[[Pair], object],
    *,
    pair: Pair | None = None,
    record: bool = False,
    head_limit: int = 0,
    tail_limit: int = 0,
    cancel_after: float | None = None,
    idle: float = 0,
    ping: bytes = b"",
    ping_every: float = 0,
) -> tuple[Result, bytes]:
    """Start a stream on `pair` (a new one by default; closed at the end), run `act` (in a thread: it
    writes the engine's side), then read everything the client gets until the relay reports; returns the
    result and the client's bytes."""

    async def run(pair: Pair) -> Result:
        loop = asyncio.get_running_loop()
        relay = native.native_relay(loop)
        assert relay is not None
        done: asyncio.Future[Result] = loop.create_future()
        client_fd, engine_fd = pair.far[0].fileno(), pair.far[1].fileno()
        stream = relay.add(
            client_fd,
            engine_fd,
            b"\n\n",
            record,
            head_limit,
            tail_limit,
            idle,
            done.set_result,
            ping,
            ping_every,
        )
        writer = loop.run_in_executor(None, act, pair)
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            relay.cancel(stream)
            pair.far[1].close()  # as Upstream.close() closes the engine transport right after
        result = await asyncio.wait_for(done, 30)
        await writer
        return result

    with pair or Pair() as used:
        result = asyncio.run(run(used))
        for far in used.far:
            far.close()  # the relay closed its copies: the client now reads to the end
        received = b""
        if used.client.fileno() >= 0:
            used.client.settimeout(10)
            while data := used.client.recv(1 << 20):
                received += data
    return result, received


def python_framing(data: bytes) -> ResponseReader:
    """The oracle: the one response reader, past a chunked head, fed `data` in one read."""
    framing = chunked_reader()
    framing.feed(data)
    return framing


@pytest.mark.parametrize("seed", range(6))
def test_whole_bodies_in_any_reads_end_complete_as_python_follows_them(seed: int) -> None:
    rng = random.Random(seed)
    body = chunked(events(rng.randint(1, 40), seed), b"x-trailer: 1\r\n" if seed % 2 else b"")
    extra = b"HTTP/1.1 200 OK\r\n" if seed % 3 == 0 else b""  # the engine speaks beyond its answer
    data = body + extra

    def write(pair: Pair) -> None:
        at = 0
        while at < len(data):  # cut anywhere: in size lines, in data, between CR and LF
            step = rng.choice([1, 2, 3, 7, 64, 500, 4096])
            pair.engine.sendall(data[at : at + step])
            at += step

    result, received = relay(write)
    assert result.end is End.COMPLETE
    assert received == body and result.sent == len(body)
    # bytes beyond the end are seen when they come in the read that ends the body; later ones, by the
    # front on the idle connection (Upstream.data_received)
    assert result.excess <= bool(extra) and result.at_boundary is False  # ended after the trailers
    assert result.tail == python_framing(body).tail
    assert result.first_data > 0 and result.invalid is None


@pytest.mark.parametrize("cut", [0, 1, 3, 5, 9, 40, 200, -7, -5, -3, -1])
def test_a_body_the_engine_cuts_ends_where_python_would_say(cut: int) -> None:
    body = chunked(events(5, cut))
    prefix = body[: cut % len(body)]

    def write(pair: Pair) -> None:
        pair.engine.sendall(prefix)
        pair.engine.shutdown(socket.SHUT_WR)

    result, received = relay(write)
    expected = python_framing(prefix)
    assert result.end is (End.COMPLETE if expected.complete else End.ENGINE_CLOSED)
    assert received == prefix and result.sent == len(prefix)
    assert result.at_boundary == expected.at_boundary
    assert result.tail == expected.tail


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"zz\r\nhello\r\n", "invalid chunk size"),
        (b"-5\r\nhello\r\n", "invalid chunk size"),
        (b"1" * 5000, "a chunk line is too long"),
    ],
)
def test_invalid_framing_is_not_passed_on(data: bytes, why: str) -> None:
    first = chunked([b"data: ok\n\n"])[:-5]  # one whole chunk, then the bad one

    def write(pair: Pair) -> None:
        pair.engine.sendall(first)
        pair.engine.sendall(data)

    result, received = relay(write)
    assert result.end is End.INVALID and result.invalid == why
    # the whole chunks before the bad bytes, however they were read, and nothing after them; then the front
    # ends the stream with an error event: what was written ends between chunks
    assert received == first and result.sent == len(first)
    assert result.at_boundary and result.tail == python_framing(first).tail


def python_reads(data: bytes) -> ResponseReader:
    """The reader over `data` after one whole chunk: in one read with it, and byte by byte after it, the
    same verdict; found invalid in the one read, it passes on the whole chunk before and stops between
    chunks."""
    first = chunked([b"data: ok\n\n"])[:-5]
    together = chunked_reader()
    bytewise = python_framing(first)
    errors = []
    for framing, reads in (
        (together, [first + data]),
        (bytewise, [data[i : i + 1] for i in range(len(data))]),
    ):
        for read in reads:
            framing.feed(read)
        if framing.invalid is not None:
            errors.append(framing.invalid)
    assert len(errors) in (0, 2) and len(set(errors)) <= 1
    if errors:  # (byte by byte, the bytes of a line before its end were passed on already)
        assert together.valid == len(first) and together.at_boundary
        assert together.tail == python_framing(first).tail
        raise ValueError(errors[0])
    return together


@pytest.mark.parametrize(("line", "size"), SIZE_LINES)
def test_size_lines_follow_one_rule_in_python_and_in_c(line: bytes, size: int | None) -> None:
    first = chunked([b"data: ok\n\n"])[:-5]
    small = size is not None and size <= 64
    data = line + (b"x" * size + b"\r\n0\r\n\r\n" if size is not None and small else b"xyz")

    def write(pair: Pair) -> None:
        pair.engine.sendall(first)
        pair.engine.sendall(data)
        pair.engine.shutdown(socket.SHUT_WR)

    result, received = relay(write)
    if size is None:
        with pytest.raises(ValueError) as refused:
            python_reads(data)
        assert result.end is End.INVALID and result.invalid == str(refused.value)
        assert received == first and result.at_boundary  # whether `first` came in that read or not
    else:
        assert chunk_size(line[:-2]) == size
        framing = python_reads(data)
        assert result.end is (End.COMPLETE if small else End.ENGINE_CLOSED)
        assert framing.complete is small and received == first + data


@pytest.mark.parametrize("after", [b"XY", b"\rX", b"\n\r", b"\n"])
def test_the_crlf_after_a_chunks_data_is_checked(after: bytes) -> None:
    first = chunked([b"data: ok\n\n"])[:-5]
    data = b"5\r\nhello" + after + b"0\r\n\r\n"

    def write(pair: Pair) -> None:
        pair.engine.sendall(first)
        pair.engine.sendall(data)

    result, received = relay(write)
    with pytest.raises(ValueError, match="no CRLF after a chunk's data"):
        python_reads(data)
    assert result.end is End.INVALID and result.invalid == "no CRLF after a chunk's data"
    assert received == first and result.at_boundary


def test_an_engine_that_sends_nothing_for_the_idle_limit_ends_the_stream() -> None:
    # it still answers /health, say: only its silence in the middle of the body tells
    first = chunked([b"data: 1\n\n"])[:-5]

    def write(pair: Pair) -> None:
        pair.engine.sendall(first)  # and then nothing, its connection open

    result, received = relay(write, idle=0.3)
    assert result.end is End.ENGINE_IDLE and result.at_boundary
    assert received == first and result.tail == b"\n\n"


PING = b"e\r\n: keep-alive\n\n\r\n"  # server/front.py COMMENT_CHUNK


def test_a_stream_taken_at_its_head_gets_pings_until_the_engines_first_bytes() -> None:
    """llama-server sends the head as its prefill starts: the relay takes the body from there, and pings the
    client while the engine is silent (looked at every 0.25 s); the pings are not body bytes (`sent`,
    `first_data`), and stop once the engine has sent anything, even in the middle of a chunk."""
    body = chunked([b"data: 1\n\n", b"data: 2\n\n"])
    times: dict[str, float] = {}

    def write(pair: Pair) -> None:
        time.sleep(1.0)  # silent: a ping every 0.2 s at the sweeps
        times["first"] = time.monotonic()
        pair.engine.sendall(body[:5])  # the first chunk's size line and some data
        time.sleep(0.7)  # silent again, in the middle of a chunk: no pings now
        pair.engine.sendall(body[5:])

    result, received = relay(write, ping=PING, ping_every=0.2)
    pings = received.index(body[:5])
    assert received[:pings] == PING * (pings // len(PING)) and 3 <= pings // len(PING) <= 5
    assert received[pings:] == body
    assert result.end is End.COMPLETE and result.sent == len(body)
    assert times["first"] <= result.first_data < times["first"] + 0.5


def test_pings_are_not_the_engines_activity() -> None:
    """An engine silent for its idle limit ends the stream, however many pings went to the client."""

    def write(pair: Pair) -> None:
        time.sleep(2.0)  # and then nothing

    result, received = relay(write, ping=PING, ping_every=0.2, idle=0.6)
    assert result.end is End.ENGINE_IDLE and result.sent == 0 and result.first_data == 0
    assert received == PING * (len(received) // len(PING)) and 2 <= len(received) // len(PING) <= 4


def test_a_stream_handed_over_without_a_ping_gets_none() -> None:
    body = chunked([b"data: 1\n\n"])

    def write(pair: Pair) -> None:
        time.sleep(0.7)
        pair.engine.sendall(body)

    result, received = relay(write)
    assert result.end is End.COMPLETE and received == body


def test_the_recorder_gets_the_head_and_the_tail_of_the_data_unframed() -> None:
    data = events(200, 1)
    body = chunked(data)
    unframed = b"".join(data)

    def write(pair: Pair) -> None:
        pair.engine.sendall(body)

    result, received = relay(write, record=True, head_limit=1000, tail_limit=300)
    assert received == body
    assert result.recorded == unframed[:1000] and result.recorded_tail == unframed[-300:]
    result, _ = relay(write)
    assert result.recorded == b"" and result.recorded_tail == b""


def test_a_client_that_does_not_read_holds_the_engine_back() -> None:
    body = chunked([b"y" * 60_000] * 200)  # ~12 MB: far beyond both sockets' buffers
    pair = Pair()
    pair.client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    written = [0]

    def write(p: Pair) -> None:
        p.engine.settimeout(0.5)
        try:
            while written[0] < len(body):
                written[0] += p.engine.send(body[written[0] : written[0] + 65536])
        except TimeoutError:
            pass  # held back: the relay stopped reading

    async def start() -> Result:
        loop = asyncio.get_running_loop()
        relay = native.native_relay(loop)
        assert relay is not None
        done: asyncio.Future[Result] = loop.create_future()
        relay.add(pair.far[0].fileno(), pair.far[1].fileno(), b"\n\n", False, 0, 0, 0, done.set_result)
        await loop.run_in_executor(None, write, pair)
        assert written[0] < len(body) / 2, "the relay read on while its client did not"
        received = bytearray()

        def read_all() -> None:
            pair.client.settimeout(30)
            while len(received) < len(body):
                left = len(body) - len(received)
                received.extend(pair.client.recv(min(left, 1 << 20)))

        reader = loop.run_in_executor(None, read_all)
        pair.engine.settimeout(30)
        await loop.run_in_executor(None, pair.engine.sendall, body[written[0] :])
        await reader
        result = await asyncio.wait_for(done, 30)
        assert bytes(received) == body
        return result

    with pair:
        result = asyncio.run(start())
    assert result.end is End.COMPLETE and result.sent == len(body)


def test_cancel_closes_the_engine_side_and_ends_the_stream() -> None:
    def write(pair: Pair) -> None:
        pair.engine.sendall(chunked([b"data: 1\n\n"])[:-5])
        pair.engine.settimeout(10)
        assert pair.engine.recv(10) == b""  # the relay closed its end: the engine would stop generating

    result, received = relay(write, cancel_after=0.2)
    assert result.end is End.CANCELLED and result.at_boundary
    assert received == chunked([b"data: 1\n\n"])[:-5]


def test_a_client_that_left_ends_the_stream_when_written_to() -> None:
    def write(pair: Pair) -> None:
        pair.client.close()
        pair.engine.sendall(chunked([b"data: 1\n\n"])[:-5])

    result, _ = relay(write)
    assert result.end is End.CLIENT_GONE


def test_a_stream_cancelled_while_its_client_is_slow_is_not_at_a_boundary() -> None:
    # What was read and not yet written is dropped: the front must not append an error event as a chunk
    # (it closes the connection instead), so the relay does not say "between chunks" even when the bytes
    # it read ended at a chunk's end, as here (60 whole chunks in one read, the client reading nothing).
    whole_chunks = chunked([b"z" * 1000] * 60)[:-5]
    pair = Pair()
    pair.far[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # a Unix socket's limit is the sender's

    def write(p: Pair) -> None:
        p.engine.sendall(whole_chunks)

    result, received = relay(write, pair=pair, cancel_after=0.3)
    assert result.end is End.CANCELLED
    assert 0 < result.sent == len(received) < len(whole_chunks)
    assert not result.at_boundary
