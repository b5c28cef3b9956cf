"""Chunked bodies for the tests of the response reader (modelrunner/response_reader.py) and of the relays
held to it: the reader past a chunked head, and a framed body's data."""

from __future__ import annotations

from modelrunner.response_reader import ResponseReader, body_of

CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


def chunked_reader() -> ResponseReader:
    """A reader that has read a chunked answer's head: what it is fed next is the body."""
    reader = ResponseReader()
    assert reader.feed(CHUNKED_HEAD) == [] and reader.chunked
    return reader


def unchunked(framed: bytes) -> bytes:
    """The data of a chunked body (as far as it came), read with the one reader."""
    return body_of(chunked_reader().feed(framed), framed)
