"""The size line of chunked transfer encoding: one rule for every chunked reader of the project (the HTTP
reader, response_reader.py, used by the HTTP front, the engine calls and the CLI's client) and for _relay.c.
No asyncio here: the CLI imports it."""

from __future__ import annotations

MAX_CHUNK_LINE = 4096  # a size line (or a trailer line) longer than this is refused
MAX_CHUNK_SIZE = 1 << 62  # far beyond any answer; a size and its CRLF fit in 64 bits (_relay.c)
_HEXDIG = frozenset(b"0123456789abcdefABCDEF")
_EXTENSION = frozenset(range(256)) - (frozenset(range(32)) - {9}) - {127}  # no control bytes but tab


def chunk_size(line: bytes) -> int:
    """The size on a chunk's size line (`line` without its CRLF), by RFC 9112's rule, the one every chunked
    reader here follows (and _relay.c's `chunk_size`): chunk-size = 1*HEXDIG (leading zeros allowed; no
    sign, no 0x, no spaces) of at most MAX_CHUNK_SIZE, then optionally `;` and extensions, ignored (spaces or
    tabs may come before the `;`; no control bytes). ValueError("invalid chunk size") otherwise. Lines end
    with CRLF only: the relays pass the framing on as it came, so it must be what every client reads alike."""
    digits, semicolon, extension = line.partition(b";")
    if semicolon:
        digits = digits.rstrip(b" \t")
    if not digits or not _HEXDIG.issuperset(digits) or not _EXTENSION.issuperset(extension):
        raise ValueError("invalid chunk size")
    size = int(digits, 16)
    if size > MAX_CHUNK_SIZE:
        raise ValueError("invalid chunk size")
    return size
