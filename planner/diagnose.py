"""Hypotheses from aggregate pipeline metrics.

Each hypothesis is something to measure next, not a verdict: one aggregate metric cannot
reliably name a cause. The thresholds are the course module's.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks

#: Metrics `diagnose_pipeline` needs.
PIPELINE_METRICS: frozenset[str] = frozenset(
    {
        "trainer_idle_fraction",
        "rollout_idle_fraction",
        "verifier_fraction",
        "weight_sync_fraction",
        "queue_growth_per_minute",
        "normalized_ess",
        "oom_events",
    }
)

_FRACTIONS = PIPELINE_METRICS - {"queue_growth_per_minute", "oom_events"}

#: When nothing stands out.
FALLBACK_HYPOTHESIS = "inspect a stage-level trace"


def diagnose_pipeline(metrics: Mapping[str, float]) -> list[str]:
    """Hypotheses to test, in a fixed order; `["inspect a stage-level trace"]` when none fires.

    - trainer idle > 25 % while the queue does not grow: check rollout, verifier and input supply;
    - verifier > 30 % of the time: profile the verifier's critical path;
    - weight sync > 20 %: profile weight transfer and conversion;
    - normalised ESS < 0.5: separate policy lag from training-inference mismatch;
    - any OOM: measure phase-specific peaks, KV cache, activations and transfer buffers.
    """
    if not isinstance(metrics, Mapping):
        raise InvalidArgumentError("metrics must be a mapping of metric name -> number")
    missing = PIPELINE_METRICS - set(metrics)
    if missing:
        raise InvalidArgumentError("missing metrics: " + ", ".join(sorted(missing)))
    values = {key: _checks.real(key, metrics[key]) for key in PIPELINE_METRICS}
    for key in sorted(_FRACTIONS):
        if not 0 <= values[key] <= 1:
            raise InvalidArgumentError(f"{key} must lie in [0, 1], got {metrics[key]!r}")
    if values["oom_events"] < 0:
        raise InvalidArgumentError(
            f"oom_events must be non-negative, got {metrics['oom_events']!r}"
        )

    hypotheses = []
    if values["trainer_idle_fraction"] > 0.25 and values["queue_growth_per_minute"] <= 0:
        hypotheses.append("check rollout, verifier, and input supply")
    if values["verifier_fraction"] > 0.30:
        hypotheses.append("profile the verifier critical path")
    if values["weight_sync_fraction"] > 0.20:
        hypotheses.append("profile weight transfer and conversion")
    if values["normalized_ess"] < 0.50:
        hypotheses.append("separate policy lag from training-inference mismatch")
    if values["oom_events"] > 0:
        hypotheses.append(
            "measure phase-specific peaks, KV cache, activations, and transfer buffers"
        )
    return hypotheses or [FALLBACK_HYPOTHESIS]
