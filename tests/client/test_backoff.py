"""Reconnect backoff: grows geometrically from `initial`, never passes `cap`, jitter only shortens.

Cases: without jitter the sequence is exact; with any jitter draw every delay lies in
[(1 - jitter) * base, base] and never exceeds the cap.
"""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from rlslice.client._backoff import Backoff


def test_without_jitter_delays_double_up_to_the_cap() -> None:
    delays = Backoff(initial=0.1, cap=0.5, factor=2.0, jitter=0.0).delays()
    assert [round(d, 9) for d in itertools.islice(delays, 5)] == [0.1, 0.2, 0.4, 0.5, 0.5]


@given(
    initial=st.floats(0.001, 1.0),
    cap=st.floats(0.001, 10.0),
    jitter=st.floats(0.0, 1.0),
    draws=st.lists(st.floats(0.0, 0.999), min_size=1, max_size=30),
)
def test_every_delay_stays_within_the_cap_and_the_jitter_band(
    initial: float, cap: float, jitter: float, draws: list[float]
) -> None:
    policy = Backoff(initial=initial, cap=cap, factor=2.0, jitter=jitter)
    values = iter(draws)
    base = initial
    for delay in itertools.islice(policy.delays(lambda: next(values)), len(draws)):
        assert (1.0 - jitter) * base - 1e-12 <= delay <= base + 1e-12
        assert delay <= max(initial, cap) + 1e-12
        base = min(cap, base * 2.0)
