"""Pipeline, stragglers, ESS, completion masks and queue growth: the course's numbers.

Cases: 60/20 s x 10 batches (800 vs 620 s); 90/10 s x 20 batches (2000 vs 1810 s, 1.105,
at most 1.11); stragglers 3,3,4,4,5,5,6,18 (48 of 144 GPU-s, a third); capped at 8 s (43 of
64 GPU-s); ESS of (1,2,2,8) and of the clipped (1,2,2,2); equal weights; masks with and
without EOS; 14 M vs 10 M tokens/min; refusals naming the argument; ESS bounds (property).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.planner import (
    completion_token_mask,
    effective_sample_size,
    pipeline_report,
    queue_growth_per_minute,
    straggler_report,
)


def test_ten_batches_of_60_s_rollout_and_20_s_training_take_800_s_or_620_s_pipelined() -> None:
    report = pipeline_report(rollout_seconds=60.0, train_seconds=20.0, batches=10)
    assert report.sequential_total == 800.0
    assert report.pipeline_total == 620.0
    assert report.period_seconds == 60.0
    assert report.bottleneck == "rollout"


def test_ninety_seconds_of_generation_cannot_hide_behind_ten_of_training() -> None:
    report = pipeline_report(rollout_seconds=90.0, train_seconds=10.0, batches=20)
    assert report.sequential_batch_seconds == 100.0
    assert report.period_seconds == 90.0
    assert report.sequential_total == 2000.0
    assert report.pipeline_total == 1810.0
    assert report.speedup == pytest.approx(1.105, abs=5e-4)
    assert report.period_speedup == pytest.approx(1.111, abs=5e-4)


def test_a_straggler_group_uses_a_third_of_its_capacity() -> None:
    report = straggler_report([3, 3, 4, 4, 5, 5, 6, 18])
    assert report.work_gpu_seconds == 48
    assert report.group_seconds == 18
    assert report.capacity_gpu_seconds == 144
    assert report.utilization == pytest.approx(1 / 3)
    assert report.idle_gpu_seconds == 96


@pytest.mark.parametrize("longest", [9, 20, 40])
def test_capping_the_last_rollout_at_8_s_gives_43_gpu_s_of_work_in_64(longest: float) -> None:
    report = straggler_report([2, 3, 4, 5, 6, 7, 8, longest], cap_seconds=8)
    assert report.work_gpu_seconds == 43
    assert report.group_seconds == 8
    assert report.capacity_gpu_seconds == 64
    assert report.utilization == pytest.approx(43 / 64)
    assert report.truncated == 1


def test_weights_1_2_2_8_have_an_ess_of_169_over_73() -> None:
    weights = [1, 2, 2, 8]
    assert sum(weights) == 13
    assert sum(w * w for w in weights) == 73
    assert effective_sample_size(weights) == pytest.approx(169 / 73)
    assert effective_sample_size(weights, normalized=True) == pytest.approx(169 / 73 / 4)


def test_clipping_the_last_log_weight_at_log_2_gives_a_normalised_ess_of_0_942() -> None:
    logs = [0.0, math.log(2), math.log(2), math.log(8)]
    assert effective_sample_size(logs, log=True) == pytest.approx(169 / 73)
    clipped = [min(value, math.log(2)) for value in logs]
    assert effective_sample_size(clipped, log=True) == pytest.approx(49 / 13)
    assert effective_sample_size(clipped, log=True, normalized=True) == pytest.approx(
        0.942, abs=5e-4
    )


def test_four_equal_weights_have_an_ess_of_4_and_a_normalised_ess_of_1() -> None:
    assert effective_sample_size([0.5] * 4) == pytest.approx(4)
    assert effective_sample_size([0.5] * 4, normalized=True) == pytest.approx(1)


def test_the_completion_mask_keeps_tokens_up_to_and_including_the_first_eos() -> None:
    suffix = np.array([[5, 6, 2, 0, 0], [7, 8, 9, 10, 11], [2, 2, 0, 0, 0]])
    mask = completion_token_mask(suffix, [2])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert mask.sum(axis=1).tolist() == [3, 5, 1]


def test_the_completion_mask_accepts_several_eos_ids_and_none() -> None:
    suffix = np.array([[5, 3, 9], [1, 4, 4]])
    assert completion_token_mask(suffix, [3, 4]).tolist() == [[1, 1, 0], [1, 1, 0]]
    assert completion_token_mask(suffix, []).tolist() == [[1, 1, 1], [1, 1, 1]]


def test_14m_tokens_a_minute_into_a_10m_trainer_grow_the_queue_by_4m() -> None:
    assert queue_growth_per_minute(14e6, 10e6) == 4e6
    assert queue_growth_per_minute(9e6, 10e6) == 0.0


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: pipeline_report(-1, 1, 1), "rollout_seconds"),
        (lambda: pipeline_report(1, math.nan, 1), "train_seconds"),
        (lambda: pipeline_report(1, 1, True), "batches"),
        (lambda: pipeline_report(1, 1, 0), "batches"),
        (lambda: straggler_report([]), "durations"),
        (lambda: straggler_report([1, math.inf]), r"durations\[1\]"),
        (lambda: straggler_report([1, 2], cap_seconds=0), "cap_seconds"),
        (lambda: effective_sample_size([1, -1]), "weights"),
        (lambda: effective_sample_size([0, 0]), "weights"),
        (lambda: effective_sample_size([1, False]), r"weights\[1\]"),
        (lambda: completion_token_mask(np.array([1, 2]), [2]), "token_ids"),
        (lambda: completion_token_mask(np.array([[1.5]]), [2]), "token_ids"),
        (lambda: queue_growth_per_minute(math.inf, 1), "arrival_tokens_per_minute"),
    ],
)
def test_bad_input_raises_a_value_error_naming_the_argument(call: object, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        call()  # type: ignore[operator]


@given(st.lists(st.floats(0.001, 1000), min_size=1, max_size=50))
def test_ess_lies_between_one_and_n(weights: list[float]) -> None:
    ess = effective_sample_size(weights)
    assert 1 - 1e-9 <= ess <= len(weights) + 1e-9
