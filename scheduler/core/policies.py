"""Waiter ordering policies: pure functions of the queue, the jobs and the time.

- `fifo`: arrival order.
- `priority`: higher priority first; every second of waiting adds `AGING_PER_SECOND` to a
  waiter's effective priority, so a low-priority job is served after a bounded wait.
- `fair`: least weighted GPU-seconds held (held seconds / weight) first.

Ties fall back to arrival order, so every policy is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from rlslice.config import Policy
from rlslice.scheduler.core.state import JobRecord, Waiter

#: Effective priority gained per second of waiting (priority policy).
AGING_PER_SECOND = 1.0

SortKey = Callable[[Waiter], tuple[float, float, int]]


def _fifo(jobs: Mapping[str, JobRecord], now: float) -> SortKey:
    return lambda w: (0.0, w.since, w.ticket)


def _priority(jobs: Mapping[str, JobRecord], now: float) -> SortKey:
    def key(w: Waiter) -> tuple[float, float, int]:
        record = jobs.get(w.job)
        base = record.priority if record else 0
        return (-(base + AGING_PER_SECOND * max(0.0, now - w.since)), w.since, w.ticket)

    return key


def _fair(jobs: Mapping[str, JobRecord], now: float) -> SortKey:
    def key(w: Waiter) -> tuple[float, float, int]:
        record = jobs.get(w.job)
        usage = record.held_seconds / record.weight if record else 0.0
        return (usage, w.since, w.ticket)

    return key


_KEYS: dict[Policy, Callable[[Mapping[str, JobRecord], float], SortKey]] = {
    Policy.FIFO: _fifo,
    Policy.PRIORITY: _priority,
    Policy.FAIR: _fair,
}


def order(
    policy: Policy, queue: Sequence[Waiter], jobs: Mapping[str, JobRecord], now: float
) -> tuple[Waiter, ...]:
    """The waiters in the order they would be served now."""
    if policy is Policy.FIFO:
        return tuple(queue)  # arrival order already
    return tuple(sorted(queue, key=_KEYS[policy](jobs, now)))


def pick(
    policy: Policy, queue: Sequence[Waiter], jobs: Mapping[str, JobRecord], now: float
) -> Waiter | None:
    """The next waiter to serve: the first connected one in policy order, or None."""
    candidates = [w for w in queue if w.attached]
    if not candidates:
        return None
    if policy is Policy.FIFO:
        return candidates[0]
    return min(candidates, key=_KEYS[policy](jobs, now))
