"""JSON and times exactly as Go's encoding/json writes them, so our config and manifest blobs are
byte-identical to DMR's (a model ID is the digest of those bytes).

Go differs from Python's json module in small ways that change every digest: no spaces; non-ASCII text
kept as UTF-8; `<`, `>`, `&`, U+2028 and U+2029 escaped as `\\u003c` ...; struct fields in declaration
order (callers build dicts in that order) and map keys sorted (callers use `sorted_map`). Invalid UTF-8
becomes U+FFFD byte by byte (`go_string`). Times are RFC 3339 with nanoseconds, trailing zeros dropped,
and the zone offset (`Z` for UTC), as time.Time marshals.
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Mapping
from typing import Any

_HTML_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_NEEDS_ESCAPE = frozenset(_HTML_ESCAPES)


def dumps(value: Any) -> bytes:
    """Compact JSON as Go's json.Marshal writes it (dict order is kept: sort maps with `sorted_map`)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if not _NEEDS_ESCAPE.isdisjoint(text):
        # These characters only ever occur inside JSON strings, so a plain replacement is exact.
        text = "".join(_HTML_ESCAPES.get(char, char) for char in text)
    return text.encode("utf-8")


def sorted_map(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A Go map[string]... marshals with its keys sorted by their bytes (UTF-8 order = code point order)."""
    return {key: mapping[key] for key in sorted(mapping)}


def _replace_one_byte(error: UnicodeError) -> tuple[str, int]:
    # Go's decoder replaces each invalid byte on its own; Python's "replace" may cover several at once.
    assert isinstance(error, UnicodeDecodeError)
    return "\ufffd", error.start + 1


codecs.register_error("modelrunner-go-replace", _replace_one_byte)


def go_string(raw: bytes) -> str:
    """Bytes read from a file as the string Go would marshal: invalid UTF-8 as one U+FFFD per byte."""
    return raw.decode("utf-8", errors="modelrunner-go-replace")


def rfc3339nano(unix_ns: int, utc_offset_s: int) -> str:
    """time.Time's JSON form: `2006-01-02T15:04:05.999999999Z07:00` (fraction without trailing zeros)."""
    seconds, nanos = divmod(unix_ns, 1_000_000_000)
    wall = time.gmtime(seconds + utc_offset_s)
    text = (
        f"{wall.tm_year:04d}-{wall.tm_mon:02d}-{wall.tm_mday:02d}"
        f"T{wall.tm_hour:02d}:{wall.tm_min:02d}:{wall.tm_sec:02d}"
    )
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    if utc_offset_s == 0:
        return text + "Z"
    sign = "-" if utc_offset_s < 0 else "+"
    minutes = abs(utc_offset_s) // 60  # Go drops an offset's seconds
    return f"{text}{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def local_rfc3339nano(unix_ns: int) -> str:
    """A file time as Go's os.FileInfo.ModTime() marshals: in the local time zone (TZ, /etc/localtime)."""
    return rfc3339nano(unix_ns, time.localtime(unix_ns // 1_000_000_000).tm_gmtoff)


def go_quote(text: str) -> str:
    """Go's `%q` of a string (strconv.Quote) for the printable text DMR's messages quote."""
    return json.dumps(text, ensure_ascii=False)


def parse_bool(text: str) -> bool | None:
    """Go's strconv.ParseBool: None for what it refuses (DMR reads query flags and `--think` with it)."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None
