"""`rlslice.units`: the one byte formatter and the one size parser.

Case matrix:

| part | checked |
|---|---|
| `format_bytes` | every unit from B to PiB, two decimals by default, one on request, whole bytes without decimals, the sign kept, PiB the largest unit, non-finite counts refused |
| `parse_size` | plain bytes, IEC (`GiB`, `Mi`), SI (`G`, `kB`), decimals and exponents, blanks around; junk refused naming the text |
| both | a parsed IEC size formats back to the same number and unit |
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.units import GiB, KiB, MiB, format_bytes, parse_size


@pytest.mark.parametrize(
    ("count", "decimals", "text"),
    [
        (0, 2, "0 B"),
        (1023, 2, "1023 B"),
        (1024, 2, "1.00 KiB"),
        (1536, 1, "1.5 KiB"),
        (5 * MiB, 1, "5.0 MiB"),
        (16 * GiB, 2, "16.00 GiB"),
        (112_000_000_000, 2, "104.31 GiB"),
        (3 * 1024**4, 1, "3.0 TiB"),
        (2048 * 1024**4, 1, "2.0 PiB"),
        (1024**6, 2, "1024.00 PiB"),
        (-1536, 2, "-1.50 KiB"),
        (-512, 2, "-512 B"),
    ],
)
def test_counts_are_shown_in_the_largest_iec_unit_below_1024(
    count: int, decimals: int, text: str
) -> None:
    assert format_bytes(count, decimals=decimals) == text


@pytest.mark.parametrize("count", [math.inf, -math.inf, math.nan])
def test_a_count_that_is_not_finite_is_refused(count: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        format_bytes(count)


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("1073741824", GiB),
        ("1GiB", GiB),
        ("512MiB", 512 * MiB),
        ("512 mib", 512 * MiB),
        ("4Ki", 4 * KiB),
        ("2G", 2 * 10**9),
        ("3kB", 3000),
        ("7b", 7),
        ("1.5GiB", 3 * GiB // 2),
        ("1e3", 1000),
        ("  16GiB  ", 16 * GiB),
    ],
)
def test_sizes_are_read_in_iec_and_si_units(text: str, count: int) -> None:
    assert parse_size(text) == count


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "12 parsecs", "1 GiB GiB", "0x10"])
def test_a_text_that_is_not_a_size_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size") as raised:
        parse_size(text)
    assert repr(text) in str(raised.value)


@given(st.integers(1, 1023), st.sampled_from(["KiB", "MiB", "GiB", "TiB"]))
def test_a_parsed_iec_size_formats_back_to_itself(number: int, unit: str) -> None:
    assert format_bytes(parse_size(f"{number}{unit}")) == f"{number}.00 {unit}"
