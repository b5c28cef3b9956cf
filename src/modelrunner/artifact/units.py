"""Sizes and parameter counts as DMR prints them in safetensors and DDUF configs: docker/go-units'
CustomSize("%.2f%s", value, 1000, units) (`pkg/distribution/format/format.go`).

Decimal units, no space, always two decimals: "253.11MB", "500.00B", "16.78M", "183.00". A size of zero
or less is "n/a". (GGUF configs use gguf-parser's units instead: see gguf_config.py.)
"""

from __future__ import annotations

_SIZE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")
_PARAMETER_UNITS = ("", "K", "M", "B", "T")


def _custom_size(value: float, units: tuple[str, ...]) -> str:
    index = 0
    while value >= 1000 and index < len(units) - 1:
        value /= 1000
        index += 1
    return f"{value:.2f}{units[index]}"


def format_size(n_bytes: float) -> str:
    """253113024 -> "253.11MB"; 500 -> "500.00B"; 1500 -> "1.50kB"; 0 -> "n/a" (format.FormatSize)."""
    if n_bytes <= 0:
        return "n/a"
    return _custom_size(float(n_bytes), _SIZE_UNITS)


def format_parameters(n: float) -> str:
    """16777216 -> "16.78M"; 7e9 -> "7.00B"; 183 -> "183.00" (format.formatParameters)."""
    if n < 0:
        raise ValueError(f"cannot format a negative parameter count: {n}")
    return _custom_size(float(n), _PARAMETER_UNITS)
