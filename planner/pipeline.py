"""Throughput arithmetic: a two-stage pipeline, straggler groups, importance weights.

Worked numbers (seeds 000 and 001):

- rollout 60 s, training 20 s, 10 batches: 800 s one after the other, 620 s pipelined;
- rollout 90 s, training 10 s, 20 batches: 2000 s vs 1810 s, a speedup of only 1.105
  (at most 100/90 = 1.11 per period): 90 s of generation cannot hide behind 10 s of training;
- a synchronous group of rollouts taking 3,3,4,4,5,5,6,18 s uses a third of its capacity;
  capping the last of 2..8,L at 8 s gives 43 GPU-s of work in 64 GPU-s of capacity;
- importance weights (1,2,2,8): sum 13, sum of squares 73, ESS 169/73 = 2.32, normalised 0.58;
  clipping the last log-weight at log 2 gives (1,2,2,2) and a normalised ESS of about 0.942.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


@dataclass(frozen=True)
class PipelineReport:
    """Two stages (rollout, training) run one after the other vs overlapped."""

    rollout_seconds: float
    train_seconds: float
    batches: int
    #: one batch end to end, and the period of the sequential loop
    sequential_batch_seconds: float
    #: the period once the pipeline is full: the slower stage
    period_seconds: float
    sequential_total: float
    pipeline_total: float
    #: sequential_total / pipeline_total
    speedup: float
    #: sequential_batch_seconds / period_seconds: the limit as batches grow
    period_speedup: float
    #: "rollout" or "training": the stage that sets the period
    bottleneck: str


def pipeline_report(rollout_seconds: float, train_seconds: float, batches: int) -> PipelineReport:
    """Total time of `batches` batches, sequential vs an ideal two-stage pipeline.

    The pipeline fills once (rollout + training) and then delivers one batch per period,
    the slower stage: `pipeline_total = r + t + (batches - 1) * max(r, t)`.
    """
    rollout = _checks.real("rollout_seconds", rollout_seconds, minimum=0)
    train = _checks.real("train_seconds", train_seconds, minimum=0)
    count = _checks.integer("batches", batches, minimum=1)
    if rollout + train <= 0:
        raise InvalidArgumentError("rollout_seconds + train_seconds must be positive")
    one = rollout + train
    period = max(rollout, train)
    sequential = count * one
    pipelined = one + (count - 1) * period
    return PipelineReport(
        rollout_seconds=rollout,
        train_seconds=train,
        batches=count,
        sequential_batch_seconds=one,
        period_seconds=period,
        sequential_total=sequential,
        pipeline_total=pipelined,
        speedup=sequential / pipelined,
        period_speedup=one / period,
        bottleneck="rollout" if rollout >= train else "training",
    )


@dataclass(frozen=True)
class StragglerReport:
    """A synchronous group: every worker waits for the slowest before the next step."""

    workers: int
    #: useful GPU-seconds: the sum of durations
    work_gpu_seconds: float
    #: wall time of the group: the slowest duration
    group_seconds: float
    #: workers x group_seconds
    capacity_gpu_seconds: float
    utilization: float
    idle_gpu_seconds: float
    idle_fraction: float
    #: how many durations `cap_seconds` shortened
    truncated: int


def straggler_report(
    durations: Sequence[float], *, cap_seconds: float | None = None
) -> StragglerReport:
    """Utilisation of a synchronous group of rollouts, one per worker.

    `cap_seconds` truncates long rollouts. Utilisation rises, but if long answers belong
    to hard tasks, the cap changes the data distribution and the observed reward.
    """
    values = _checks.reals("durations", durations, minimum=0)
    truncated = 0
    if cap_seconds is not None:
        cap = _checks.real("cap_seconds", cap_seconds, positive=True)
        truncated = sum(1 for value in values if value > cap)
        values = tuple(min(value, cap) for value in values)
    group = max(values)
    if group <= 0:
        raise InvalidArgumentError("durations must contain a positive duration")
    work = math.fsum(values)
    capacity = len(values) * group
    return StragglerReport(
        workers=len(values),
        work_gpu_seconds=work,
        group_seconds=group,
        capacity_gpu_seconds=capacity,
        utilization=work / capacity,
        idle_gpu_seconds=capacity - work,
        idle_fraction=1 - work / capacity,
        truncated=truncated,
    )


def effective_sample_size(
    weights: Sequence[float], *, log: bool = False, normalized: bool = False
) -> float:
    """Kish's effective sample size, `(sum w)^2 / sum w^2`; with `normalized`, divided by n.

    With `log=True` the inputs are log importance ratios (computed stably). Equal weights
    give n (normalised 1); a dominant weight drives it towards 1. A high ESS does not show
    that the denominator is right, that clipping adds no bias, or that the masks are correct.
    """
    values = _checks.reals("weights", weights)
    if log:
        top = max(values)
        values = tuple(math.exp(value - top) for value in values)
    elif any(value < 0 for value in values):
        raise InvalidArgumentError("weights must be non-negative (pass log=True for log-ratios)")
    total = math.fsum(values)
    squares = math.fsum(value * value for value in values)
    if squares == 0:
        raise InvalidArgumentError("weights must not all be zero")
    ess = total * total / squares
    return ess / len(values) if normalized else ess


def completion_token_mask(
    token_ids: npt.ArrayLike, eos_token_ids: Iterable[int]
) -> npt.NDArray[np.int64]:
    """1 for each generated token up to and including the first EOS of its row, 0 after.

    `token_ids` is a 2-D (batch x generated) array of the suffix a model produced; rows
    that never emit EOS are all ones. The count per row is the number of generated tokens
    that the policy really chose, the ones that belong in a loss or a throughput figure.
    """
    import numpy as np

    ids = np.asarray(token_ids)
    if ids.ndim != 2:
        raise InvalidArgumentError(f"token_ids must be 2-D (batch x tokens), got {ids.ndim}-D")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise InvalidArgumentError(f"token_ids must hold integers, got {ids.dtype}")
    eos = [_checks.integer("eos_token_ids[]", value) for value in eos_token_ids]
    is_eos = np.isin(ids, eos) if eos else np.zeros(ids.shape, dtype=bool)
    # EOS strictly before position j ends the completion; the EOS itself is kept.
    before = np.cumsum(is_eos, axis=1) - is_eos
    mask: npt.NDArray[np.int64] = (before == 0).astype(np.int64)
    return mask


def queue_growth_per_minute(
    arrival_tokens_per_minute: float, service_tokens_per_minute: float
) -> float:
    """How fast an unbounded queue grows: lambda - mu when lambda >= mu, else 0.

    14 M tokens/min arriving at a trainer that consumes 10 M grows the queue by 4 M a
    minute, for ever: the condition lambda < mu is broken and only backpressure helps.
    """
    arrival = _checks.real("arrival_tokens_per_minute", arrival_tokens_per_minute, minimum=0)
    service = _checks.real("service_tokens_per_minute", service_tokens_per_minute, minimum=0)
    return max(0.0, arrival - service)
