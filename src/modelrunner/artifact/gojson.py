"""JSON and times exactly as Go's encoding/json writes them, so our config and manifest blobs are
byte-identical to DMR's (a model ID is the digest of those bytes).

Go differs from Python's json module in small ways that change every digest: no spaces; non-ASCII text
kept as UTF-8; `<`, `>`, `&`, U+2028 and U+2029 escaped as `\\u003c` ...; struct fields in declaration
order (callers build dicts in that order) and map keys sorted (callers use `sorted_map`). Invalid UTF-8
becomes U+FFFD byte by byte (`go_string`). Times are RFC 3339 with nanoseconds, trailing zeros dropped,
and the zone offset (`Z` for UTC), as time.Time marshals.

Every layer writes and reads Go's JSON and times through this module (the store's blobs, the daemon's
API and recorder, the CLI's output), so it imports nothing of the project's.
"""

from __future__ import annotations

import codecs
import json
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

_HTML_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_NEEDS_ESCAPE = frozenset(_HTML_ESCAPES)


def dumps(value: Any, indent: str | None = None) -> bytes:
    """JSON as Go's json.Marshal writes it, or json.MarshalIndent(value, "", indent) with `indent` (dict
    order is kept: sort maps with `sorted_map`). No trailing newline."""
    return dumps_text(value, indent).encode("utf-8")


def dumps_text(value: Any, indent: str | None = None) -> str:
    """`dumps` as text, for what is printed or logged rather than hashed."""
    separators = (",", ":") if indent is None else (",", ": ")
    text = json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, allow_nan=False)
    if not _NEEDS_ESCAPE.isdisjoint(text):
        # These characters only ever occur inside JSON strings, so a plain replacement is exact.
        text = "".join(_HTML_ESCAPES.get(char, char) for char in text)
    return text


def as_interface(value: Any) -> Any:
    """A decoded JSON value as Go holds it after json.Unmarshal into `interface{}`, ready for `dumps`:
    objects become maps (keys sorted) and numbers float64 (so 1.0 marshals as `1`)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {key: as_interface(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [as_interface(item) for item in value]
    return value


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


def time_text(moment: datetime) -> str:
    """A datetime as time.Time marshals (aware datetimes keep their offset; naive ones are UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    offset = moment.utcoffset()
    offset_s = int(offset.total_seconds()) if offset is not None else 0
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    unix_ns = (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
    return rfc3339nano(unix_ns, offset_s)


ZERO_TIME = "0001-01-01T00:00:00Z"  # an unset time.Time, as Go marshals it

_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|[+-](\d{2}):(\d{2}))")


def _parsed(text: str) -> tuple[datetime, str]:
    """time.Time's UnmarshalJSON: the moment (to the microsecond) and the fraction's digits as written;
    ValueError saying what Go would refuse."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError("an RFC 3339 time")
    year, month, day, hour, minute, second, fraction, zone, zone_h, zone_m = match.groups()
    if zone != "Z" and (int(zone_h) > 23 or int(zone_m) > 59):
        raise ValueError("a time with a valid zone offset")
    offset = (
        timedelta(0)
        if zone == "Z"
        else int(zone[0] + "1") * timedelta(hours=int(zone_h), minutes=int(zone_m))
    )
    fraction = fraction or ""
    try:
        moment = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int(fraction[:6].ljust(6, "0")),
            tzinfo=timezone(offset),
        )
    except ValueError:
        raise ValueError("a valid time") from None
    return moment, fraction


def parse_time(text: str) -> datetime:
    """An RFC 3339 time as time.Time's UnmarshalJSON reads it (offset kept; the fraction to the
    microsecond). ValueError, saying what Go wants, for what Go refuses."""
    return _parsed(text)[0]


def remarshal_time(text: str) -> str:
    """A time through Go's UnmarshalJSON and MarshalJSON: the same instant and offset, the fraction cut
    to 9 digits without trailing zeros, a zero offset as `Z`. ValueError for what Go refuses."""
    moment, fraction = _parsed(text)
    out = text[:19]  # the date and clock, as written
    fraction = fraction[:9].rstrip("0")
    if fraction:
        out += "." + fraction
    return out + ("Z" if moment.utcoffset() == timedelta(0) else text[-6:])


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
