"""units.py follows pkg/distribution/format/format.go (go-units CustomSize); the first cases of each table
are upstream's own (format_test.go: TestFormatSize, TestFormatParameters)."""

from __future__ import annotations

import pytest

from modelrunner.artifact.units import format_parameters, format_size


@pytest.mark.parametrize(
    ("n_bytes", "expected"),
    [
        (0, "n/a"),
        (-1, "n/a"),
        (500, "500.00B"),
        (1500, "1.50kB"),
        (1_000_000, "1.00MB"),
        (2_500_000, "2.50MB"),
        (1_000_000_000, "1.00GB"),
        (4_300_000_000, "4.30GB"),
        (1_200_000_000_000, "1.20TB"),
        (999, "999.00B"),
        (999_999, "1000.00kB"),  # go-units steps up on the raw value, then rounds
        (253_113_024, "253.11MB"),
        (2e15, "2.00PB"),
    ],
)
def test_format_size(n_bytes: float, expected: str) -> None:
    assert format_size(n_bytes) == expected


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1000, "1.00K"),
        (1_000_000, "1.00M"),
        (1_000_000_000, "1.00B"),
        (7_000_000_000, "7.00B"),
        (0, "0.00"),
        (183, "183.00"),
        (16_781_312, "16.78M"),  # safetensors_model_test.go: "16.78M"
        (268_098_176, "268.10M"),
        (1.5e12, "1.50T"),
    ],
)
def test_format_parameters(n: float, expected: str) -> None:
    assert format_parameters(n) == expected


def test_negative_parameter_counts_are_refused() -> None:
    with pytest.raises(ValueError):
        format_parameters(-5)
