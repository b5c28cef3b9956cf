"""One table of chunked-encoding size lines (RFC 9112: chunk-size = 1*HEXDIG, extensions after `;`, CRLF),
valid and invalid, for every chunked reader to be tested against: chunking.chunk_size and the readers that
use it (response_reader.ResponseReader), and the C relay (_relay.c)."""

from __future__ import annotations

# (the size line as sent, with its line end; the size, or None where the line is invalid)
SIZE_LINES: list[tuple[bytes, int | None]] = [
    (b"5\r\n", 5),
    (b"a\r\n", 10),
    (b"A\r\n", 10),
    (b"0005\r\n", 5),  # leading zeros are valid
    (b"0" * 30 + b"5\r\n", 5),  # however many
    (b"5;name=value\r\n", 5),  # extensions are ignored
    (b"5 ;name\r\n", 5),  # spaces or tabs may come before the `;`
    (b'5\t;x="a b"\r\n', 5),
    (b"4000000000000000\r\n", 1 << 62),  # the largest size
    (b"4000000000000001\r\n", None),  # over 2^62
    (b"10000000000000000\r\n", None),  # over 2^64
    (b"ffffffffffffffffffff\r\n", None),
    (b"0x5\r\n", None),
    (b"+5\r\n", None),
    (b"-5\r\n", None),
    (b" 5\r\n", None),
    (b"5 \r\n", None),  # spaces only before extensions
    (b"5_0\r\n", None),  # Python's int() would take it
    (b"zz\r\n", None),
    (b"\r\n", None),  # no size
    (b";x\r\n", None),
    (b"5;a\x00b\r\n", None),  # control bytes in an extension
    (b"5;a\rb\r\n", None),
    (b"5\n", None),  # a bare LF: not what every client reads alike
    (b"5\r\r\n", None),
]
