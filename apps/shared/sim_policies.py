"""The scheduler's waiter-ordering policies as pickers for the planner's simulator.

The planner sits below the scheduler, so it cannot import the policies; this module, in
the applications layer, may import both. `picker(policy, phases)` wraps
`rlslice.scheduler.core.policies.pick`: every decision of a simulated group is made by
the function the scheduler itself calls, over the same kinds of values (waiters, job
records, the group's declared phases, the time). There is no second implementation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlslice.config import DEFAULT_STAGE_AGING_SECONDS, PhaseKind, PhaseSpec, Policy
from rlslice.planner.waiters import Picker, QueuedJob
from rlslice.scheduler.core.policies import pick
from rlslice.scheduler.core.state import JobRecord, Waiter

#: The policies a simulation can name (every one the scheduler has).
POLICY_NAMES: tuple[str, ...] = tuple(policy.value for policy in Policy)


def phase_table(kinds: Mapping[str, str]) -> dict[str, PhaseSpec]:
    """`{phase name: kind}` as a group spec's `phases` (unknown kinds are an error)."""
    return {name: PhaseSpec(kind=PhaseKind(kind)) for name, kind in kinds.items()}


def picker(
    policy: str,
    phases: Mapping[str, PhaseSpec] | None = None,
    *,
    stage_aging_seconds: float = DEFAULT_STAGE_AGING_SECONDS,
) -> Picker:
    """A `Picker` that serves what the scheduler's `policy` would serve.

    `phases` is the group spec's phase table (phase name -> kind); the `stage` policy
    reads it, the others do not."""
    chosen = Policy(policy)
    table: Mapping[str, PhaseSpec] = dict(phases or {})

    def choose(queue: Sequence[QueuedJob], now: float) -> str:
        waiters = [Waiter(w.job, w.ticket, w.since, w.phase) for w in queue]
        records = {w.job: _record(w) for w in queue}
        served = pick(
            chosen,
            waiters,
            records,
            now,
            phases=table,
            stage_aging_seconds=stage_aging_seconds,
        )
        if served is None:  # pick() only skips detached waiters; these are all attached
            raise AssertionError("the policy picked no waiter from a non-empty queue")
        return served.job

    return choose


def _record(waiter: QueuedJob) -> JobRecord:
    """The job record the policy reads: its scheduling inputs (no lease: never consulted)."""
    return JobRecord(
        name=waiter.job,
        lease_id="",
        secret_hash="",
        lease_seconds=1.0,
        expires_at=float("inf"),
        priority=waiter.priority,
        weight=waiter.weight,
        held_seconds=waiter.held_seconds,
        last_served_at=waiter.last_served_at,
        phase=waiter.phase,
    )
