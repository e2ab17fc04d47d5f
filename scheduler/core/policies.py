"""Waiter ordering policies: pure functions of the queue, the jobs and the time.

Which to pick (docs/scheduler.md says more):

- `fifo`: arrival order. Two jobs, or jobs alike: the order hardly matters, keep it simple.
- `priority`: higher priority first; every second of waiting adds `AGING_PER_SECOND` to a
  waiter's effective priority, so a low-priority job is served after a bounded wait. Pick it
  when some jobs matter more than others.
- `fair`: least weighted GPU-seconds held (held seconds / weight) first. Pick it when jobs
  should get GPU time in agreed shares.
- `lrs`: least recently served first: the waiter whose last hold ended longest ago; a job
  never served goes before any served one. Pick it for three or more jobs of similar
  shape: no job is passed over twice in a row. Bound: once a job waits, every other job is
  served at most once before it (each one served moves behind it), so it waits at most
  `n - 1` holds for `n` jobs.
- `stage`: by what the waiter's phase is (its kind, declared per phase name in the group
  spec's `phases`): a `sync` first (short, and it may hold other groups meanwhile), then a
  `train` (it consumes finished rollouts and unblocks the next ones), then a `rollout` or
  an undeclared phase; arrival order within a kind. Pick it for RL jobs whose phase kinds
  differ (one rollout-heavy, one train-heavy). Bound: a waiter that has waited
  `stage_aging_seconds` (default 300) goes first, oldest first, so it waits at most
  `stage_aging_seconds` plus the holds of the waiters that arrived before it (at most one
  per other job) plus the current hold.

Ties fall back to arrival order, so every policy is deterministic. The functions take plain
values (waiters, job records, the declared phases, the time), so the planner's simulator
runs this very code through the applications layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from rlslice.config import DEFAULT_STAGE_AGING_SECONDS, PhaseKind, PhaseSpec, Policy
from rlslice.scheduler.core.state import GroupState, JobRecord, Waiter

#: Effective priority gained per second of waiting (priority policy).
AGING_PER_SECOND = 1.0

#: `stage` policy: the rank of each phase kind (lower goes first); undeclared phases rank
#: with `rollout`.
STAGE_RANK: Mapping[PhaseKind | None, int] = {
    PhaseKind.SYNC: 0,
    PhaseKind.TRAIN: 1,
    PhaseKind.ROLLOUT: 2,
    None: 2,
}

SortKey = Callable[[Waiter], tuple[float, ...]]
_NO_PHASES: Mapping[str, PhaseSpec] = {}


def _fifo(
    jobs: Mapping[str, JobRecord], now: float, phases: Mapping[str, PhaseSpec], aging: float
) -> SortKey:
    return lambda w: (w.since, w.ticket)


def _priority(
    jobs: Mapping[str, JobRecord], now: float, phases: Mapping[str, PhaseSpec], aging: float
) -> SortKey:
    def key(w: Waiter) -> tuple[float, ...]:
        record = jobs.get(w.job)
        base = record.priority if record else 0
        return (-(base + AGING_PER_SECOND * max(0.0, now - w.since)), w.since, w.ticket)

    return key


def _fair(
    jobs: Mapping[str, JobRecord], now: float, phases: Mapping[str, PhaseSpec], aging: float
) -> SortKey:
    def key(w: Waiter) -> tuple[float, ...]:
        record = jobs.get(w.job)
        usage = record.held_seconds / record.weight if record else 0.0
        return (usage, w.since, w.ticket)

    return key


def _lrs(
    jobs: Mapping[str, JobRecord], now: float, phases: Mapping[str, PhaseSpec], aging: float
) -> SortKey:
    def key(w: Waiter) -> tuple[float, ...]:
        record = jobs.get(w.job)
        served = record.last_served_at if record is not None else None
        return (float("-inf") if served is None else served, w.since, w.ticket)

    return key


def _stage(
    jobs: Mapping[str, JobRecord], now: float, phases: Mapping[str, PhaseSpec], aging: float
) -> SortKey:
    def key(w: Waiter) -> tuple[float, ...]:
        if now - w.since >= aging:
            return (0.0, w.since, 0.0, w.ticket)  # aged: oldest first, before any other
        declared = phases.get(w.phase)
        rank = STAGE_RANK[declared.kind if declared is not None else None]
        return (1.0, float(rank), w.since, w.ticket)

    return key


_KEYS: dict[
    Policy, Callable[[Mapping[str, JobRecord], float, Mapping[str, PhaseSpec], float], SortKey]
] = {
    Policy.FIFO: _fifo,
    Policy.PRIORITY: _priority,
    Policy.FAIR: _fair,
    Policy.LRS: _lrs,
    Policy.STAGE: _stage,
}


def order(
    policy: Policy,
    queue: Sequence[Waiter],
    jobs: Mapping[str, JobRecord],
    now: float,
    *,
    phases: Mapping[str, PhaseSpec] | None = None,
    stage_aging_seconds: float = DEFAULT_STAGE_AGING_SECONDS,
) -> tuple[Waiter, ...]:
    """The waiters in the order they would be served now.

    `phases` is the group spec's phase table (name -> kind) and `stage_aging_seconds` its
    aging bound; only `stage` reads them."""
    if policy is Policy.FIFO:
        return tuple(queue)  # arrival order already
    key = _KEYS[policy](jobs, now, phases or _NO_PHASES, stage_aging_seconds)
    return tuple(sorted(queue, key=key))


def pick(
    policy: Policy,
    queue: Sequence[Waiter],
    jobs: Mapping[str, JobRecord],
    now: float,
    *,
    phases: Mapping[str, PhaseSpec] | None = None,
    stage_aging_seconds: float = DEFAULT_STAGE_AGING_SECONDS,
) -> Waiter | None:
    """The next waiter to serve: the first connected one in policy order, or None."""
    candidates = [w for w in queue if w.attached]
    if not candidates:
        return None
    if policy is Policy.FIFO:
        return candidates[0]
    key = _KEYS[policy](jobs, now, phases or _NO_PHASES, stage_aging_seconds)
    return min(candidates, key=key)


def pick_next(state: GroupState, now: float) -> Waiter | None:
    """The waiter `state`'s group serves next, under its spec's policy and phase table."""
    spec = state.spec
    return pick(
        spec.policy,
        state.queue,
        state.jobs,
        now,
        phases=spec.phases,
        stage_aging_seconds=spec.stage_aging_seconds,
    )
