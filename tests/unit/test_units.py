from __future__ import annotations

import pytest

from modelrunner.artifact.units import format_parameters, format_size


@pytest.mark.parametrize(
    ("n_bytes", "expected"),
    [
        (0, "0B"),
        (512, "512B"),
        (999, "999B"),
        (1000, "1.00kB"),
        (1500, "1.50kB"),
        (461_184, "461.18kB"),
        (999_999, "1.00MB"),  # rounds up into the next unit rather than "1000.00kB"
        (253_113_024, "253.11MB"),
        (4.92e9, "4.92GB"),
        (1.5e12, "1.50TB"),
        (2e15, "2.00PB"),
    ],
)
def test_format_size(n_bytes: float, expected: str) -> None:
    assert format_size(n_bytes) == expected


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0"),
        (7, "7"),
        (999, "999"),
        (1.2e3, "1.20K"),
        (113_088, "113.09K"),
        (268_098_176, "268.10M"),
        (361_820_000, "361.82M"),
        (8.03e9, "8.03B"),
        (1.5e12, "1.50T"),
    ],
)
def test_format_parameters(n: float, expected: str) -> None:
    assert format_parameters(n) == expected


def test_negative_quantities_are_refused() -> None:
    with pytest.raises(ValueError):
        format_size(-1)
    with pytest.raises(ValueError):
        format_parameters(-5)
