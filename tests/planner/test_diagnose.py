"""diagnose_pipeline: the course's rule set, its order, and its refusals.

Cases: a healthy pipeline gets the fallback; each rule fires alone at its threshold
(strictly above/below); all fire together in a fixed order; a starving trainer with a
growing queue is not blamed on supply; missing metrics, out-of-range fractions, negative
OOM counts, bools and NaN are refused naming the metric.
"""

from __future__ import annotations

import math

import pytest

from rlslice.planner import diagnose_pipeline

HEALTHY = {
    "trainer_idle_fraction": 0.10,
    "rollout_idle_fraction": 0.10,
    "verifier_fraction": 0.10,
    "weight_sync_fraction": 0.05,
    "queue_growth_per_minute": 0.0,
    "normalized_ess": 0.90,
    "oom_events": 0,
}


def test_a_healthy_pipeline_gets_the_fallback_hypothesis() -> None:
    assert diagnose_pipeline(HEALTHY) == ["inspect a stage-level trace"]


@pytest.mark.parametrize(
    ("change", "hypothesis"),
    [
        ({"trainer_idle_fraction": 0.26}, "check rollout, verifier, and input supply"),
        ({"verifier_fraction": 0.31}, "profile the verifier critical path"),
        ({"weight_sync_fraction": 0.21}, "profile weight transfer and conversion"),
        ({"normalized_ess": 0.49}, "separate policy lag from training-inference mismatch"),
        (
            {"oom_events": 1},
            "measure phase-specific peaks, KV cache, activations, and transfer buffers",
        ),
    ],
)
def test_each_rule_fires_alone(change: dict[str, float], hypothesis: str) -> None:
    assert diagnose_pipeline({**HEALTHY, **change}) == [hypothesis]


@pytest.mark.parametrize(
    "change",
    [
        {"trainer_idle_fraction": 0.25},
        {"verifier_fraction": 0.30},
        {"weight_sync_fraction": 0.20},
        {"normalized_ess": 0.50},
    ],
)
def test_thresholds_are_strict(change: dict[str, float]) -> None:
    assert diagnose_pipeline({**HEALTHY, **change}) == ["inspect a stage-level trace"]


def test_an_idle_trainer_with_a_growing_queue_is_not_blamed_on_supply() -> None:
    metrics = {**HEALTHY, "trainer_idle_fraction": 0.6, "queue_growth_per_minute": 1000.0}
    assert diagnose_pipeline(metrics) == ["inspect a stage-level trace"]


def test_all_rules_fire_in_a_fixed_order() -> None:
    metrics = {
        "trainer_idle_fraction": 0.5,
        "rollout_idle_fraction": 0.0,
        "verifier_fraction": 0.4,
        "weight_sync_fraction": 0.3,
        "queue_growth_per_minute": -5.0,
        "normalized_ess": 0.2,
        "oom_events": 3,
    }
    assert diagnose_pipeline(metrics) == [
        "check rollout, verifier, and input supply",
        "profile the verifier critical path",
        "profile weight transfer and conversion",
        "separate policy lag from training-inference mismatch",
        "measure phase-specific peaks, KV cache, activations, and transfer buffers",
    ]


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({k: v for k, v in HEALTHY.items() if k != "oom_events"}, "missing metrics: oom_events"),
        ({**HEALTHY, "verifier_fraction": 1.5}, r"verifier_fraction must lie in \[0, 1\]"),
        ({**HEALTHY, "oom_events": -1}, "oom_events must be non-negative"),
        ({**HEALTHY, "normalized_ess": math.nan}, "normalized_ess must be finite"),
        ({**HEALTHY, "oom_events": True}, "oom_events must be a number"),
    ],
)
def test_bad_metrics_are_refused_naming_the_metric(metrics: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        diagnose_pipeline(metrics)
