"""Human-readable sizes and parameter counts, as DMR prints them in model configs.

Decimal (SI) units, no space, two decimals: "253.11MB", "8.03B". Values below the first unit are
printed as plain integers ("512B", "999").
"""

from __future__ import annotations

_SIZE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
_PARAMETER_UNITS = ("", "K", "M", "B", "T")


def _scaled(value: float, units: tuple[str, ...]) -> str:
    if value < 0:
        raise ValueError(f"cannot format a negative quantity: {value}")
    if value < 1000:
        return f"{int(value)}{units[0]}"
    index = 0
    while index < len(units) - 1 and round(value, 2) >= 1000:
        value /= 1000
        index += 1
    return f"{value:.2f}{units[index]}"


def format_size(n_bytes: float) -> str:
    """253113024 -> "253.11MB"; 512 -> "512B"; 1500 -> "1.50kB"."""
    return _scaled(n_bytes, _SIZE_UNITS)


def format_parameters(n: float) -> str:
    """268098176 -> "268.10M"; 8.03e9 -> "8.03B"; 1200 -> "1.20K"; 999 -> "999"."""
    return _scaled(n, _PARAMETER_UNITS)
