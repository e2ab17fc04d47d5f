"""Waiter ordering policies, as tables.

Cases: fifo keeps arrival order; priority puts higher first, ties by arrival; aging lifts
a long-waiting low-priority job over a newer high-priority one; fair puts least weighted
held seconds first, weight scales it; pick skips detached waiters; an empty queue picks none.
"""

from __future__ import annotations

import pytest

from rlslice.config import Policy
from rlslice.scheduler.core import AGING_PER_SECOND, JobRecord, Waiter, order, pick


def _jobs(**spec: tuple[int, float, float]) -> dict[str, JobRecord]:
    return {
        name: JobRecord(name, "l", "h", 30, 1e9, priority=p, weight=w, held_seconds=held)
        for name, (p, w, held) in spec.items()
    }


JOBS = _jobs(a=(0, 1.0, 100.0), b=(5, 1.0, 10.0), c=(5, 2.0, 30.0), d=(-3, 1.0, 0.0))


@pytest.mark.parametrize(
    ("policy", "arrivals", "now", "expected"),
    [
        (Policy.FIFO, [("a", 0), ("b", 1), ("c", 2)], 3, ["a", "b", "c"]),
        (Policy.FIFO, [("c", 0), ("a", 1)], 3, ["c", "a"]),
        (Policy.PRIORITY, [("a", 0), ("b", 0.5), ("c", 1)], 1, ["b", "c", "a"]),
        (Policy.PRIORITY, [("c", 0), ("b", 0.5)], 1, ["c", "b"]),
        # a has waited 10 s longer than b: aging lifts priority 0 over 5.
        (Policy.PRIORITY, [("a", 0), ("b", 10)], 10, ["a", "b"]),
        (Policy.PRIORITY, [("d", 0), ("a", 2)], 2.5, ["a", "d"]),
        (Policy.FAIR, [("a", 0), ("b", 1), ("c", 2), ("d", 3)], 4, ["d", "b", "c", "a"]),
        # c held 30 s with weight 2 -> 15 weighted, more than b's 10.
        (Policy.FAIR, [("c", 0), ("b", 1)], 4, ["b", "c"]),
    ],
)
def test_each_policy_orders_waiters_as_its_table_says(
    policy: Policy, arrivals: list[tuple[str, float]], now: float, expected: list[str]
) -> None:
    queue = [Waiter(job, i + 1, since) for i, (job, since) in enumerate(arrivals)]
    assert [w.job for w in order(policy, queue, JOBS, now)] == expected
    first = pick(policy, queue, JOBS, now)
    assert first is not None
    assert first.job == expected[0]


def test_aging_rate_is_what_the_docs_promise() -> None:
    assert AGING_PER_SECOND == 1.0


@pytest.mark.parametrize("policy", list(Policy))
def test_pick_skips_detached_waiters(policy: Policy) -> None:
    queue = [Waiter("a", 1, 0, attached=False), Waiter("b", 2, 1)]
    chosen = pick(policy, queue, _jobs(a=(100, 1.0, 0.0), b=(0, 1.0, 50.0)), 2)
    assert chosen is not None
    assert chosen.job == "b"


@pytest.mark.parametrize("policy", list(Policy))
def test_an_empty_queue_picks_nobody(policy: Policy) -> None:
    assert pick(policy, [], JOBS, 0) is None
