"""The RL-loop simulator: determinism, the barrier, the bounded queue and the lag limit.

Cases: the same seed gives the same run, another seed another; sequential has zero lag
and ESS 1 and never backpressure; bounded async trains more tokens per second than the
barrier; admission stops at the threshold so the queue exceeds it by at most what was in
flight; no trained rollout is older than max_policy_lag; lag grows with sync cadence;
result_row is flat; bad configs are refused naming the field; invariants hold for random
configs (property).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlslice.planner import PipelineConfig, result_row, simulate_pipeline

SEED = 12016


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    config = PipelineConfig(mode="bounded_async", seed=SEED)
    assert simulate_pipeline(config) == simulate_pipeline(config)
    other = simulate_pipeline(PipelineConfig(mode="bounded_async", seed=SEED + 1))
    assert other.batches != simulate_pipeline(config).batches


def test_the_barrier_has_no_lag_full_ess_and_no_backpressure() -> None:
    result = simulate_pipeline(PipelineConfig(mode="sequential", seed=SEED))
    assert result.updates > 0
    assert all(b.mean_lag == 0 and b.max_lag == 0 for b in result.batches)
    assert all(b.normalized_ess == pytest.approx(1.0) for b in result.batches)
    assert result.backpressure_seconds == 0
    assert result.discarded_rollouts == 0
    assert result.trainer_idle_fraction > 0.3  # the trainer waits for every generation


def test_bounded_async_trains_more_tokens_per_second_than_the_barrier() -> None:
    barrier = simulate_pipeline(PipelineConfig(mode="sequential", seed=SEED))
    overlapped = simulate_pipeline(PipelineConfig(mode="bounded_async", seed=SEED))
    assert overlapped.trained_tokens_per_second > barrier.trained_tokens_per_second
    assert overlapped.trainer_idle_fraction < barrier.trainer_idle_fraction


def test_admission_stops_at_the_threshold_so_overshoot_is_only_what_was_in_flight() -> None:
    config = PipelineConfig(
        mode="bounded_async",
        max_queue_tokens=7000,
        max_policy_lag=6,
        sync_every_updates=3,
        seed=SEED,
    )
    result = simulate_pipeline(config)
    assert result.backpressure_seconds > 0
    limit = config.max_queue_tokens + config.generators * config.max_response_tokens
    assert result.max_queue_tokens_observed <= limit
    assert all(row["queue_tokens"] <= limit for row in result.timeline)


@pytest.mark.parametrize("lag", [0, 1, 2, 6])
def test_no_trained_rollout_is_older_than_the_policy_lag_limit(lag: int) -> None:
    result = simulate_pipeline(
        PipelineConfig(mode="bounded_async", max_policy_lag=lag, sync_every_updates=1, seed=SEED)
    )
    assert all(b.max_lag <= lag for b in result.batches)


def test_rarer_synchronization_means_older_data_and_lower_ess() -> None:
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    often = simulate_pipeline(
        PipelineConfig(
            mode="bounded_async",
            max_policy_lag=6,
            sync_every_updates=1,
            seed=SEED,
            duration_seconds=600.0,
        )
    )
    rarely = simulate_pipeline(
        PipelineConfig(
            mode="bounded_async",
            max_policy_lag=6,
            sync_every_updates=4,
            seed=SEED,
            duration_seconds=600.0,
        )
    )
    assert mean([b.mean_lag for b in rarely.batches]) > mean([b.mean_lag for b in often.batches])
    assert mean([b.normalized_ess for b in rarely.batches]) < mean(
        [b.normalized_ess for b in often.batches]
    )


def test_a_result_row_is_flat_and_finite() -> None:
    row = result_row(simulate_pipeline(PipelineConfig(mode="bounded_async", seed=SEED)))
    assert row["mode"] == "bounded_async"
    for key, value in row.items():
        assert isinstance(value, int | float | str), key
        if isinstance(value, float):
            assert math.isfinite(value), key


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "async"}, "mode"),
        ({"duration_seconds": 0.0}, "duration_seconds"),
        ({"duration_seconds": math.inf}, "duration_seconds"),
        ({"max_queue_tokens": True}, "max_queue_tokens"),
        ({"max_policy_lag": -1}, "max_policy_lag"),
        ({"sync_every_updates": 0}, "sync_every_updates"),
        ({"generators": 2.0}, "generators"),
        ({"seed": None}, "seed"),
        ({"lag_drift": math.nan}, "lag_drift"),
    ],
)
def test_a_bad_config_is_refused_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        PipelineConfig(**kwargs)  # type: ignore[arg-type]


def test_simulate_pipeline_refuses_anything_but_a_config() -> None:
    with pytest.raises(ValueError, match="config"):
        simulate_pipeline({"mode": "sequential"})  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    mode=st.sampled_from(["sequential", "bounded_async"]),
    queue=st.integers(500, 20_000),
    lag=st.integers(0, 5),
    every=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_invariants_hold_for_random_configs(
    mode: str, queue: int, lag: int, every: int, seed: int
) -> None:
    config = PipelineConfig(
        mode=mode,
        duration_seconds=90.0,
        max_queue_tokens=queue,  # type: ignore[arg-type]
        max_policy_lag=lag,
        sync_every_updates=every,
        seed=seed,
    )
    result = simulate_pipeline(config)
    assert 0 <= result.trainer_idle_fraction <= 1
    assert result.trained_tokens == sum(b.tokens for b in result.batches)
    assert all(0 < b.normalized_ess <= 1 + 1e-12 for b in result.batches)
    assert [b.update for b in result.batches] == list(range(1, result.updates + 1))
    times = [row["time"] for row in result.timeline]
    assert times == sorted(times)
    assert times[-1] <= config.duration_seconds
    if mode == "bounded_async":
        assert all(b.max_lag <= lag for b in result.batches)
