"""Weight-sync cadence, transfer time and checkpoint cadence: the course's numbers.

Cases: K=4 gives lags 0,1,2,3 (max 3, mean 1.5), and over 10 updates a sum of 13, mean 1.3;
the notebook's K in (1,2,4,8) over 16 updates; 14 GB over 25 GB/s at 80 % with 0.15 s
setup is 0.85 s, 140 MB is 0.157 s; Young's interval for 180 s / 10 h is 3600 s (60 min),
5 % + 5 % overhead, and it minimises the overhead; refusals naming the argument.
"""

from __future__ import annotations

import math

import pytest

from rlslice.planner import (
    checkpoint_cadence,
    optimal_checkpoint_interval,
    synchronization_schedule,
    synchronization_transfer_time,
)


def test_publishing_every_4_updates_leaves_stationary_lags_0_1_2_3() -> None:
    schedule = synchronization_schedule(sync_every=4, updates=4)
    assert schedule.lags == (0, 1, 2, 3)
    assert schedule.max_lag == 3
    assert schedule.mean_lag == 1.5
    assert schedule.stationary_mean_lag == 1.5


def test_ten_updates_with_k_4_have_lags_summing_to_13_and_mean_1_3() -> None:
    schedule = synchronization_schedule(sync_every=4, updates=10)
    assert schedule.lags == (0, 1, 2, 3, 0, 1, 2, 3, 0, 1)
    assert sum(schedule.lags) == 13
    assert schedule.mean_lag == pytest.approx(1.3)
    assert schedule.synchronization_count == 2


@pytest.mark.parametrize(
    ("every", "count", "mean", "worst"),
    [(1, 16, 0.0, 0), (2, 8, 0.5, 1), (4, 4, 1.5, 3), (8, 2, 3.5, 7)],
)
def test_the_notebook_cadence_table(every: int, count: int, mean: float, worst: int) -> None:
    schedule = synchronization_schedule(sync_every=every, updates=16)
    assert (schedule.synchronization_count, schedule.mean_lag, schedule.max_lag) == (
        count,
        mean,
        worst,
    )


def test_full_7b_weights_take_0_85_s_and_a_1_percent_adapter_0_157_s() -> None:
    full = synchronization_transfer_time(14_000_000_000, 25.0, setup_seconds=0.15, efficiency=0.8)
    adapter = synchronization_transfer_time(140_000_000, 25.0, setup_seconds=0.15, efficiency=0.8)
    assert full == pytest.approx(0.85)
    assert adapter == pytest.approx(0.157)


def test_young_interval_for_180_s_checkpoints_and_a_10_hour_mtbf_is_one_hour() -> None:
    interval = optimal_checkpoint_interval(180.0, 10 * 3600.0)
    assert interval == pytest.approx(3600.0)
    assert interval / 60 == pytest.approx(60.0)
    cadence = checkpoint_cadence(interval, checkpoint_seconds=180.0, mtbf_seconds=36_000.0)
    assert cadence.checkpoint_overhead_fraction == pytest.approx(0.05)
    assert cadence.expected_rework_fraction == pytest.approx(0.05)
    assert cadence.total_overhead_fraction == pytest.approx(0.10)
    assert cadence.checkpoints_per_day == pytest.approx(24.0)


@pytest.mark.parametrize("factor", [0.5, 0.8, 1.25, 2.0])
def test_young_interval_minimises_the_first_order_overhead(factor: float) -> None:
    best = optimal_checkpoint_interval(180.0, 36_000.0)
    at_best = checkpoint_cadence(best, checkpoint_seconds=180.0, mtbf_seconds=36_000.0)
    other = checkpoint_cadence(best * factor, checkpoint_seconds=180.0, mtbf_seconds=36_000.0)
    assert other.total_overhead_fraction > at_best.total_overhead_fraction


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: synchronization_schedule(0, 10), "sync_every"),
        (lambda: synchronization_schedule(True, 10), "sync_every"),
        (lambda: synchronization_schedule(4, 0), "updates"),
        (lambda: synchronization_transfer_time(-1, 25.0), "payload_bytes"),
        (lambda: synchronization_transfer_time(1, 0.0), "bandwidth_gb_per_second"),
        (lambda: synchronization_transfer_time(1, 25.0, efficiency=1.5), "efficiency"),
        (lambda: synchronization_transfer_time(1, 25.0, setup_seconds=math.nan), "setup_seconds"),
        (lambda: optimal_checkpoint_interval(0.0, 1.0), "checkpoint_seconds"),
        (lambda: optimal_checkpoint_interval(1.0, math.inf), "mtbf_seconds"),
        (
            lambda: checkpoint_cadence(-1.0, checkpoint_seconds=1.0, mtbf_seconds=1.0),
            "interval_seconds",
        ),
    ],
)
def test_bad_input_raises_a_value_error_naming_the_argument(call: object, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        call()  # type: ignore[operator]
