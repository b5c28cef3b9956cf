"""artifact/gojson.py: the one writer and reader of Go's encoding/json output and time.Time text (the
expected strings are what Go 1.24's json.Marshal, json.MarshalIndent and time.Time's MarshalJSON and
UnmarshalJSON give for the same values)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from modelrunner.artifact import gojson


def test_html_characters_and_line_separators_are_escaped_as_go_escapes_them() -> None:
    value = {"a": "<b>&é\u2028\u2029", "<k>": ["&"]}
    assert (
        gojson.dumps(value)
        == '{"a":"\\u003cb\\u003e\\u0026é\\u2028\\u2029","\\u003ck\\u003e":["\\u0026"]}'.encode()
    )


def test_non_ascii_text_stays_utf8_and_control_characters_are_escaped() -> None:
    assert gojson.dumps({"k": "日本\n\t\x01"}) == '{"k":"日本\\n\\t\\u0001"}'.encode()


def test_indent_is_marshal_indent_with_an_empty_prefix() -> None:
    value = [{"k": [1, {}], "e": []}]
    assert (
        gojson.dumps_text(value, indent="  ")
        == '[\n  {\n    "k": [\n      1,\n      {}\n    ],\n    "e": []\n  }\n]'
    )
    assert gojson.dumps_text({"a": 1}, indent="\t") == '{\n\t"a": 1\n}'
    assert gojson.dumps({"a": "<"}, indent="  ") == b'{\n  "a": "\\u003c"\n}'


def test_nan_is_refused_as_go_refuses_it() -> None:
    with pytest.raises(ValueError):
        gojson.dumps({"x": float("nan")})


def test_as_interface_sorts_every_map_and_writes_whole_floats_as_integers() -> None:
    decoded = {"b": 1.0, "a": [{"z": 2.5, "y": 1e21, "x": -3.0}], "c": True}
    assert (
        gojson.dumps_text(gojson.as_interface(decoded)) == '{"a":[{"x":-3,"y":1e+21,"z":2.5}],"b":1,"c":true}'
    )


def test_rfc3339nano_drops_the_fraction_s_trailing_zeros() -> None:
    second = 1_700_000_000 * 1_000_000_000
    assert gojson.rfc3339nano(second, 0) == "2023-11-14T22:13:20Z"
    assert gojson.rfc3339nano(second + 120_000_000, 0) == "2023-11-14T22:13:20.12Z"
    assert gojson.rfc3339nano(second + 1, 0) == "2023-11-14T22:13:20.000000001Z"
    assert gojson.rfc3339nano(second, -(5 * 3600 + 30 * 60)) == "2023-11-14T16:43:20-05:30"


def test_time_text_keeps_the_offset_and_takes_naive_times_as_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert (
        gojson.time_text(datetime(2025, 1, 2, 3, 4, 5, 500_000, tzinfo=plus_two))
        == "2025-01-02T03:04:05.5+02:00"
    )
    assert gojson.time_text(datetime(2025, 1, 2, 3, 4, 5)) == "2025-01-02T03:04:05Z"
    assert gojson.time_text(datetime(1, 1, 1, tzinfo=UTC)) == gojson.ZERO_TIME


def test_zero_time_reads_as_the_first_instant_of_year_one() -> None:
    assert gojson.ZERO_TIME == "0001-01-01T00:00:00Z"
    assert gojson.parse_time(gojson.ZERO_TIME) == datetime(1, 1, 1, tzinfo=UTC)
    assert gojson.remarshal_time(gojson.ZERO_TIME) == gojson.ZERO_TIME


@pytest.mark.parametrize(
    ("text", "marshalled"),
    [
        ("2025-01-02T03:04:05Z", "2025-01-02T03:04:05Z"),
        ("2025-01-02T03:04:05.120000Z", "2025-01-02T03:04:05.12Z"),
        ("2025-01-02T03:04:05.000Z", "2025-01-02T03:04:05Z"),
        ("2025-01-02T03:04:05.1234567891Z", "2025-01-02T03:04:05.123456789Z"),
        ("2025-01-02T03:04:05+00:00", "2025-01-02T03:04:05Z"),
        ("2025-01-02T03:04:05-00:00", "2025-01-02T03:04:05Z"),
        ("2025-01-02T03:04:05.10+05:30", "2025-01-02T03:04:05.1+05:30"),
    ],
)
def test_remarshal_time_is_unmarshal_then_marshal(text: str, marshalled: str) -> None:
    assert gojson.remarshal_time(text) == marshalled


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("2025-01-02", "an RFC 3339 time"),
        ("2025-01-02 03:04:05Z", "an RFC 3339 time"),
        ("2025-01-02T03:04:05", "an RFC 3339 time"),
        ("2025-02-30T03:04:05Z", "a valid time"),
        ("2025-01-02T03:04:05+24:00", "a time with a valid zone offset"),
    ],
)
def test_what_go_cannot_read_is_refused_with_what_it_wants(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        gojson.remarshal_time(text)
    with pytest.raises(ValueError, match=reason):
        gojson.parse_time(text)


def test_parse_time_keeps_the_instant_and_offset() -> None:
    moment = gojson.parse_time("2025-01-02T03:04:05.1234567-02:00")
    assert moment.utcoffset() == timedelta(hours=-2)
    assert moment == datetime(2025, 1, 2, 5, 4, 5, 123456, tzinfo=UTC)


def test_parse_bool_is_strconv_parse_bool() -> None:
    assert [gojson.parse_bool(t) for t in ("1", "t", "TRUE", "True")] == [True] * 4
    assert [gojson.parse_bool(t) for t in ("0", "f", "FALSE", "False")] == [False] * 4
    assert gojson.parse_bool("yes") is None
