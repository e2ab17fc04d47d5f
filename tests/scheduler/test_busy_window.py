"""The busy fraction a group status reports: which part of the last minute it was held.

Cases: no hold; one hold inside the window; a hold straddling the window's start; a hold
still open; holds long gone; and, for any sequence of holds and questions (hypothesis), the
same fraction as the definition (each hold's overlap with [now - window, now], summed).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.scheduler._runtime import BUSY_WINDOW_SECONDS, BusyWindow

W = BUSY_WINDOW_SECONDS


def test_a_group_never_held_is_idle() -> None:
    assert BusyWindow().fraction(100.0, None) == 0.0


def test_a_hold_inside_the_window_counts_whole() -> None:
    window = BusyWindow()
    window.add(100.0, 115.0)
    assert window.fraction(120.0, None) == pytest.approx(15.0 / W)


def test_a_hold_straddling_the_window_start_counts_its_part_inside() -> None:
    window = BusyWindow()
    window.add(100.0, 130.0)
    assert window.fraction(100.0 + W + 10.0, None) == pytest.approx(20.0 / W)


def test_a_hold_still_open_counts_up_to_now() -> None:
    window = BusyWindow()
    window.add(100.0, 110.0)
    assert window.fraction(130.0, holding_since=120.0) == pytest.approx(20.0 / W)


def test_holds_long_gone_count_nothing() -> None:
    window = BusyWindow()
    for i in range(1000):
        window.add(float(i), i + 0.5)
    assert window.fraction(1000.0 + 2 * W, None) == 0.0
    assert window.fraction(1000.0, None) == pytest.approx(30.0 / W)


def _defined(holds: list[tuple[float, float]], now: float, since: float | None) -> float:
    start = now - W
    busy = sum(max(0.0, min(e, now) - max(s, start)) for s, e in holds)
    if since is not None:
        busy += max(0.0, now - max(since, start))
    return min(1.0, busy / W)


@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 40.0),  # gap before the hold
            st.floats(0.0, 40.0),  # its length
            st.floats(-80.0, 80.0),  # when a status is asked, from the hold's end
        ),
        max_size=40,
    )
)
def test_the_fraction_is_the_summed_overlap_of_the_holds_with_the_window(
    steps: list[tuple[float, float, float]],
) -> None:
    window = BusyWindow()
    holds: list[tuple[float, float]] = []
    t = 0.0
    for gap, length, asked in steps:
        start, end = t + gap, t + gap + length
        t = end
        window.add(start, end)
        holds.append((start, end))
        # `add` forgets what is older than the window before the newest hold's end
        kept = [(s, e) for s, e in holds if e >= end - W]
        now = end + asked
        since = now - 1.0 if asked > 1.0 else None
        assert window.fraction(now, since) == pytest.approx(_defined(kept, now, since), abs=1e-9)
