"""The one HTTP/1.x response reader (modelrunner/response_reader.py), sans-IO, and the engine calls' use of
it (http1.Answer): heads, chunked bodies split at every possible place, sized and until-close bodies."""

from __future__ import annotations

import asyncio
import random

import pytest

from modelrunner.http1 import Answer, EngineIdle, UpstreamError
from modelrunner.response_reader import MAX_HEAD, ResponseReader, body_of, is_event_stream
from tests.chunk_lines import SIZE_LINES
from tests.response_bodies import chunked_reader

CHUNKED = [(b"transfer-encoding", b"chunked")]


def chunked(*parts: bytes) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


def head_of(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n"


async def collect(pieces: list[bytes], headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    stream = asyncio.StreamReader()
    for piece in [head_of(headers), *pieces]:
        stream.feed_data(piece)
    stream.feed_eof()
    answer = Answer(stream)
    await answer.read_head()
    return [chunk async for chunk in answer.chunks()]


def split_randomly(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), k=min(12, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("seed", range(20))
def test_chunked_bodies_survive_any_split(seed: int) -> None:
    events = [f'data: {{"n": {i}}}\n\n'.encode() for i in range(30)]
    out = asyncio.run(collect(split_randomly(chunked(*events), seed), CHUNKED))
    assert b"".join(out) == b"".join(events)


@pytest.mark.parametrize("seed", range(20))
def test_the_reader_gives_the_head_and_the_data_spans_wherever_reads_are_cut(seed: int) -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(30)]
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer += chunked(*events)[:-2] + b"x-trailer: 1\r\n\r\nHTTP/1.1 200"  # trailers, then bytes beyond
    reader = ResponseReader()
    data = b""
    for piece in split_randomly(answer, seed):
        data += body_of(reader.feed(piece), piece)
        assert reader.invalid is None
    assert reader.head is not None and reader.head.status == 200 and reader.head.event_stream
    assert reader.complete and reader.excess > 0 and data == b"".join(events) and reader.tail == b"\n\n"


def test_complete_chunks_that_arrive_together_are_passed_on_together() -> None:
    out = asyncio.run(collect([chunked(b"a", b"b", b"c")], CHUNKED))
    assert out == [b"abc"]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"5\r\nab", UpstreamError),  # the engine died mid-chunk
        (b"zz\r\nab\r\n", ValueError),  # not a chunk size
    ],
)
def test_broken_chunked_bodies_raise(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        asyncio.run(collect([data], CHUNKED))


@pytest.mark.parametrize(("line", "size"), SIZE_LINES)
def test_size_lines_follow_the_one_rule(line: bytes, size: int | None) -> None:
    # tests/chunk_lines.py: the table the C relay is held to as well
    if size is None:
        with pytest.raises(ValueError, match=r"invalid chunk size|does not end with CRLF"):
            asyncio.run(collect([line + b"xyz\r\n0\r\n\r\n"], CHUNKED))
    elif size <= 64:
        out = asyncio.run(collect([line + b"x" * size + b"\r\n0\r\n\r\n"], CHUNKED))
        assert b"".join(out) == b"x" * size
    else:
        with pytest.raises(UpstreamError, match="mid-response"):  # a valid size: the data did not come
            asyncio.run(collect([line + b"xyz"], CHUNKED))


@pytest.mark.parametrize("after", [b"XY", b"\rX", b"\n\r"])
def test_the_crlf_after_a_chunks_data_is_checked(after: bytes) -> None:
    with pytest.raises(ValueError, match="no CRLF after a chunk's data"):
        asyncio.run(collect([b"5\r\nhello" + after + b"0\r\n\r\n"], CHUNKED))


def test_the_whole_chunks_before_invalid_framing_are_passed_on() -> None:
    async def read() -> tuple[list[bytes], str]:
        got: list[bytes] = []
        stream = asyncio.StreamReader()
        stream.feed_data(head_of(CHUNKED) + chunked(b"first", b"second")[:-5] + b"0x5\r\nhello\r\n")
        stream.feed_eof()
        answer = Answer(stream)
        await answer.read_head()
        try:
            async for data in answer.chunks():
                got.append(data)
        except ValueError as exc:
            return got, str(exc)
        return got, ""

    assert asyncio.run(read()) == ([b"firstsecond"], "invalid chunk size")


def test_a_read_found_invalid_passes_on_its_whole_chunks_and_stops_between_chunks() -> None:
    reader = chunked_reader()
    whole = chunked(b"data: 1\n\n")[:-5]
    data = b"\n\n\r\n" + whole + b"zz\r\n"  # the end of a chunk begun in an earlier read, one whole, junk
    reader.feed(b"9\r\ndata: 1")
    spans = reader.feed(data)
    assert reader.invalid == "invalid chunk size" and reader.valid == len(data) - 4
    assert body_of(spans, data) == b"\n\n" + b"data: 1\n\n" and reader.at_boundary and reader.tail == b"\n\n"


def test_a_size_line_without_its_end_is_bounded() -> None:
    with pytest.raises(ValueError, match="a chunk line is too long"):
        asyncio.run(collect([b"0" * 5000], CHUNKED))


@pytest.mark.parametrize("headers", [CHUNKED, [(b"content-length", b"100")], []])
def test_an_engine_that_sends_nothing_for_the_idle_limit_ends_the_body(
    headers: list[tuple[bytes, bytes]],
) -> None:
    async def read() -> list[bytes]:
        stream = asyncio.StreamReader()
        stream.feed_data(head_of(headers) + (chunked(b"first")[:-5] if headers == CHUNKED else b"first"))
        answer = Answer(stream)
        await answer.read_head()
        return [data async for data in answer.chunks(idle=0.2)]

    with pytest.raises(EngineIdle, match=r"the engine sent nothing for 0\.2 seconds"):
        asyncio.run(read())


def test_sized_and_until_close_bodies() -> None:
    assert b"".join(asyncio.run(collect([b"hel", b"lo"], [(b"content-length", b"5")]))) == b"hello"
    assert b"".join(asyncio.run(collect([b"abc", b"def"], []))) == b"abcdef"
    with pytest.raises(UpstreamError):
        asyncio.run(collect([b"hel"], [(b"content-length", b"5")]))


def test_the_head() -> None:
    reader = ResponseReader()
    raw = (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nX-A:  b \r\n fold\r\nX-A: c\r\n\r\nbody"
    )
    assert reader.feed(raw[:20]) == [] and reader.head is None
    assert body_of(reader.feed(raw[20:]), raw[20:]) == b"body"
    head = reader.head
    assert head is not None and head.status == 404 and head.reason == b"Not Found" and head.keep_alive
    assert head.headers == [(b"content-type", b"application/json"), (b"x-a", b"b fold"), (b"x-a", b"c")]
    assert head.get(b"x-a") == b"b fold, c" and reader.until_close and not head.event_stream


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not HTTP"),  # known at its first line
        (b"HTTP/2 200\r\n\r\n", "not HTTP"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "not HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", "invalid content-length"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"x" * MAX_HEAD, "the response head is too large"),
    ],
)
def test_what_is_not_an_answer_is_invalid(raw: bytes, why: str) -> None:
    reader = ResponseReader()
    assert reader.feed(raw) == [] and reader.invalid == why and reader.head is None


def test_interim_answers_and_answers_without_a_body() -> None:
    reader = ResponseReader()
    data = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 204 No Content\nContent-Length: 3\n\nabc"
    assert reader.feed(data) == [] and reader.head is not None and reader.head.status == 204
    assert reader.complete and reader.excess == 3 and not reader.head.keep_alive
    head_request = ResponseReader(no_body=True)
    assert head_request.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n") == [] and head_request.complete


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        (b"text/event-stream", True),
        (b"Text/Event-Stream; charset=utf-8", True),
        ("text/event-stream", True),
        (b"application/json", False),
        (b"text/event-streams", False),
        (b"", False),
    ],
)
def test_event_streams_are_known_by_one_rule(content_type: bytes | str, expected: bool) -> None:
    assert is_event_stream(content_type) is expected


def test_chunked_framing_follows_chunks_split_anywhere() -> None:
    body = b"5\r\nhello\r\n1a;ext=1\r\n" + b"x" * 24 + b"\n\n\r\n0\r\n\r\n"
    for cut in range(1, len(body)):
        reader = chunked_reader()
        data = body_of(reader.feed(body[:cut]), body[:cut])
        assert not reader.complete
        data += body_of(reader.feed(body[cut:]), body[cut:])
        assert reader.complete and reader.tail == b"\n\n" and data == b"hello" + b"x" * 24 + b"\n\n"


def test_chunked_framing_knows_chunk_boundaries_and_trailers() -> None:
    reader = chunked_reader()
    reader.feed(b"3\r\nab")
    assert not reader.at_boundary
    reader.feed(b"c\r\n")
    assert reader.at_boundary and reader.tail == b"bc"
    reader.feed(b"0\r\nx-trailer: 1\r\n")
    assert not reader.complete and not reader.at_boundary
    reader.feed(b"\r\n")
    assert reader.complete


@pytest.mark.parametrize("junk", [b"zz\r\n", b"-5\r\n", b"1" * 5000])
def test_chunked_framing_refuses_junk(junk: bytes) -> None:
    reader = chunked_reader()
    assert reader.feed(junk) == [] and reader.invalid is not None and reader.valid == 0


def test_framing_is_chosen_from_the_headers() -> None:
    def reader(headers: list[tuple[bytes, bytes]]) -> ResponseReader:
        read = ResponseReader()
        read.feed(head_of(headers))
        return read

    assert reader(CHUNKED).chunked
    sized = reader([(b"content-length", b"4")])
    assert not sized.chunked and not sized.until_close and not sized.complete
    assert sized.feed(b"abcd") == [(0, 4)] and sized.complete
    assert reader([(b"content-length", b"0")]).complete
    assert reader([]).until_close and not reader([]).complete
    assert reader([(b"content-length", b"4, 4")]).invalid == "invalid content-length"
