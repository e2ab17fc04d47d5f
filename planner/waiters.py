"""The queue as a waiter-ordering policy sees it, for the interleaving simulator.

The planner sits below the scheduler (the import-linter `layers` contract), so it cannot
call `rlslice.scheduler.core.policies` itself. `simulate_interleaving` takes instead a
`Picker`: a function from the queued jobs and the time to the name of the job served
next. The applications layer (`rlslice.apps.shared.sim_policies`) builds one from the
scheduler's own policy code, so the simulator orders waiters with the very functions the
scheduler runs; without one the simulator serves in arrival order (`fifo_picker`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QueuedJob:
    """One waiting acquire and what the scheduler would know of its job."""

    job: str
    ticket: int
    """Arrival order of the acquire (unique, increasing)."""
    since: float
    """Simulated second the acquire was made."""
    phase: str
    """Name of the GPU phase the acquire is for (`rollout`, `train`, ...)."""
    priority: int
    weight: float
    held_seconds: float
    """Seconds the job held the group (closed holds only)."""
    last_served_at: float | None
    """When the job's last hold ended (None: never served)."""
    last_granted_at: float | None
    """When the job was last granted the group (None: never)."""


Picker = Callable[[Sequence[QueuedJob], float], str]
"""(waiters in arrival order, now) -> the name of the job to serve next."""


def fifo_picker(queue: Sequence[QueuedJob], now: float) -> str:
    """Arrival order: the first waiter."""
    return min(queue, key=lambda w: w.ticket).job
