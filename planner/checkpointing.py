"""How often to checkpoint: Young's first-order interval and what a cadence costs.

With 180 s to write a checkpoint and a mean time between failures of 10 h, the interval
is sqrt(2 x 180 x 36,000) = 3600 s, one hour; writing then costs 180/3600 = 5 % and the
expected rework after a failure half an interval in ten hours, another 5 %.

The model ignores restart time, asynchronous writes, correlated failures, the cost of
network and storage, partly lost queues, incompatible distributed layouts and risk that
changes over time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlslice.planner import _checks


def optimal_checkpoint_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Young's interval between checkpoints, `sqrt(2 * checkpoint_seconds * mtbf_seconds)`."""
    cost = _checks.real("checkpoint_seconds", checkpoint_seconds, positive=True)
    mtbf = _checks.real("mtbf_seconds", mtbf_seconds, positive=True)
    return math.sqrt(2 * cost * mtbf)


@dataclass(frozen=True)
class CheckpointCadence:
    """First-order overhead of checkpointing every `interval_seconds`."""

    interval_seconds: float
    checkpoint_seconds: float
    mtbf_seconds: float
    #: time spent writing checkpoints, checkpoint_seconds / interval
    checkpoint_overhead_fraction: float
    #: expected lost work, half an interval per failure: interval / (2 * mtbf)
    expected_rework_fraction: float
    #: the sum of both, minimised by Young's interval
    total_overhead_fraction: float
    checkpoints_per_day: float


def checkpoint_cadence(
    interval_seconds: float, *, checkpoint_seconds: float, mtbf_seconds: float
) -> CheckpointCadence:
    """The overhead of a chosen interval (compare it with `optimal_checkpoint_interval`)."""
    interval = _checks.real("interval_seconds", interval_seconds, positive=True)
    cost = _checks.real("checkpoint_seconds", checkpoint_seconds, positive=True)
    mtbf = _checks.real("mtbf_seconds", mtbf_seconds, positive=True)
    writing = cost / interval
    rework = interval / (2 * mtbf)
    return CheckpointCadence(
        interval_seconds=interval,
        checkpoint_seconds=cost,
        mtbf_seconds=mtbf,
        checkpoint_overhead_fraction=writing,
        expected_rework_fraction=rework,
        total_overhead_fraction=writing + rework,
        checkpoints_per_day=86_400 / interval,
    )
