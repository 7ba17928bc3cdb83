"""Byte counts for people: one formatter and one parser for every message, report and
command-line option (foundation: imports nothing of Ignis).

Sizes are shown in binary units (B, KiB, MiB, GiB, TiB), as PyTorch's and CuPy's
memory reports show them. Parsing takes plain integers (bytes), binary units
(``512MiB``, ``4 GiB``, and the single letters ``K``, ``M``, ``G``, ``T``) and
decimal ones (``1.5GB`` = 1.5e9 bytes, ``kB``, ``MB``, ``TB``).
"""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_bytes"]

_STEPS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_NUMBER = re.compile(r"\s*([0-9][0-9_]*(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([a-z]*)\s*")


def format_bytes(n: "int | float | None", digits: int = 1) -> str:
    """``12582912`` -> ``"12.0 MiB"``; ``None`` -> ``"-"``; negative counts keep their sign."""
    if n is None:
        return "-"
    sign, n = ("-", -n) if n < 0 else ("", n)
    for unit, size in _STEPS:
        if n >= size:
            return f"{sign}{n / size:.{digits}f} {unit}"
    return f"{sign}{int(n)} B"


def parse_bytes(text: "str | int", what: str = "byte count") -> int:
    """``"512MiB"`` -> 536870912, ``"1.5GB"`` -> 1500000000, ``4096`` -> 4096.

    Raises:
        ValueError: not a non-negative byte count; the message says what it takes.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = _NUMBER.fullmatch(str(text).lower())
        unit = m.group(2) if m else None
        if unit not in _UNITS:
            raise ValueError(f"bad {what} {text!r}: use e.g. 1048576, 512MiB, 4GiB or 1.5GB")
        number = m.group(1).replace("_", "")
        n = int(float(number) * _UNITS[unit]) if ("." in number or "e" in number) else int(number) * _UNITS[unit]
    if n < 0:
        raise ValueError(f"{what} must not be negative, got {text!r}")
    return n
