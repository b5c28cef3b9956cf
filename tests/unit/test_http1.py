"""The minimal HTTP/1.1 reader the relay uses: chunked bodies split at every possible place."""

from __future__ import annotations

import asyncio
import random

import pytest

from modelrunner.http1 import EngineIdle, UpstreamError, body_chunks, read_head
from tests.chunk_lines import SIZE_LINES

CHUNKED = [(b"transfer-encoding", b"chunked")]


def chunked(*parts: bytes) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


async def collect(pieces: list[bytes], headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    reader = asyncio.StreamReader()
    for piece in pieces:
        reader.feed_data(piece)
    reader.feed_eof()
    return [chunk async for chunk in body_chunks(reader, headers)]


def split_randomly(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), k=min(12, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("seed", range(20))
def test_chunked_bodies_survive_any_split(seed: int) -> None:
    events = [f'data: {{"n": {i}}}\n\n'.encode() for i in range(30)]
    out = asyncio.run(collect(split_randomly(chunked(*events), seed), CHUNKED))
    assert b"".join(out) == b"".join(events)


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
    # tests/chunk_lines.py: the table the C relay and front.Chunked are held to as well
    if size is None:
        with pytest.raises(ValueError, match="invalid chunk size"):
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
        reader = asyncio.StreamReader()
        reader.feed_data(chunked(b"first", b"second")[:-5] + b"0x5\r\nhello\r\n")  # in one read
        reader.feed_eof()
        got: list[bytes] = []
        try:
            async for data in body_chunks(reader, CHUNKED):
                got.append(data)
        except ValueError as exc:
            return got, str(exc)
        return got, ""

    assert asyncio.run(read()) == ([b"firstsecond"], "invalid chunk size")


def test_a_size_line_without_its_end_is_bounded() -> None:
    with pytest.raises(ValueError, match="a chunk line is too long"):
        asyncio.run(collect([b"0" * 5000], CHUNKED))


@pytest.mark.parametrize("headers", [CHUNKED, [(b"content-length", b"100")], []])
def test_an_engine_that_sends_nothing_for_the_idle_limit_ends_the_body(
    headers: list[tuple[bytes, bytes]],
) -> None:
    async def read() -> list[bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(chunked(b"first")[:-5] if headers == CHUNKED else b"first")
        chunks = []
        async for data in body_chunks(reader, headers, idle=0.2):
            chunks.append(data)
        return chunks

    with pytest.raises(EngineIdle, match=r"the engine sent nothing for 0\.2 seconds"):
        asyncio.run(read())


def test_sized_and_until_close_bodies() -> None:
    assert b"".join(asyncio.run(collect([b"hel", b"lo"], [(b"content-length", b"5")]))) == b"hello"
    assert b"".join(asyncio.run(collect([b"abc", b"def"], []))) == b"abcdef"
    with pytest.raises(UpstreamError):
        asyncio.run(collect([b"hel"], [(b"content-length", b"5")]))


def test_read_head() -> None:
    async def head() -> tuple[int, list[tuple[bytes, bytes]]]:
        reader = asyncio.StreamReader()
        reader.feed_data(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nX-A:  b \r\n\r\nbody")
        return await read_head(reader)

    status, headers = asyncio.run(head())
    assert status == 404 and headers == [(b"content-type", b"application/json"), (b"x-a", b"b")]
