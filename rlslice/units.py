"""Byte sizes as people write them: the one formatter and the one parser. Pure.

`format_bytes` shows a count in binary (IEC) units, `parse_size` reads `16GiB`, `512MiB`
or `2G` back. Every message, table and flag of rlslice goes through these two, so a size
reads the same in a refusal, in `rlslice top` and in a plan.
"""

from __future__ import annotations

import math
import re

__all__ = ["GiB", "KiB", "MiB", "format_bytes", "parse_size"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SI = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def format_bytes(count: float, *, decimals: int = 2) -> str:
    """`count` bytes in the largest IEC unit below 1024 of it, up to PiB.

    Whole bytes print without decimals; a negative count keeps its sign.

    >>> format_bytes(16 * GiB)
    '16.00 GiB'
    >>> format_bytes(1536, decimals=1)
    '1.5 KiB'
    >>> format_bytes(1023)
    '1023 B'
    """
    if not math.isfinite(count):
        raise ValueError(f"byte count must be finite, got {count!r}")
    value = float(count)
    for unit in _IEC:
        if abs(value) < 1024 or unit == _IEC[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.{decimals}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def parse_size(text: str) -> int:
    """Bytes from `1073741824`, `1GiB`, `512MiB`, `2G` (SI: powers of 1000) or `2GiB`.

    Raises ValueError for anything else.

    >>> parse_size("512MiB")
    536870912
    >>> parse_size("2G")
    2000000000
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size (try 16GiB or 512MiB)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if unit.endswith("ib") or (len(unit) == 2 and unit[1] == "i"):
        factor = 1 << (10 * "kmgt".index(unit[0]) + 10)
    else:
        factor = _SI[unit.rstrip("b")] if unit != "b" else 1
    return int(number * factor)
