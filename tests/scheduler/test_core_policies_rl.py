"""The RL-aware policies `lrs` and `stage`, as tables, and their bounds on waiting.

Cases: lrs serves a never-served job first, then the one whose last hold ended longest
ago, ties by arrival; stage orders sync, train, then rollout and undeclared phases, arrival
order within a kind; a waiter past `stage_aging_seconds` goes first, oldest first; the
stated bounds hold when a stream of favoured waiters keeps arriving (stage: aging bound;
lrs: every other job served at most once ahead of a waiter).
"""

from __future__ import annotations

import pytest

from rlslice.config import PhaseKind, PhaseSpec, Policy
from rlslice.scheduler.core import JobRecord, Waiter, order, pick

PHASES = {
    "rollout": PhaseSpec(kind=PhaseKind.ROLLOUT, expected_seconds=60),
    "train": PhaseSpec(kind=PhaseKind.TRAIN, expected_seconds=30),
    "sync": PhaseSpec(kind=PhaseKind.SYNC),
}


def _record(name: str, served: float | None = None) -> JobRecord:
    return JobRecord(name, "l", "h", 30, 1e9, last_served_at=served)


@pytest.mark.parametrize(
    ("served", "arrivals", "expected"),
    [
        # a's last hold ended at 5, b's at 2: b has waited for the GPU longer.
        ({"a": 5.0, "b": 2.0}, ["a", "b"], ["b", "a"]),
        # c never held the group: it goes before any served job.
        ({"a": 5.0, "b": 2.0, "c": None}, ["a", "b", "c"], ["c", "b", "a"]),
        # Two never served: arrival order.
        ({"a": None, "b": None}, ["b", "a"], ["b", "a"]),
        # Equal last service: arrival order.
        ({"a": 3.0, "b": 3.0}, ["b", "a"], ["b", "a"]),
    ],
)
def test_lrs_serves_the_least_recently_served_job_first(
    served: dict[str, float | None], arrivals: list[str], expected: list[str]
) -> None:
    jobs = {name: _record(name, at) for name, at in served.items()}
    queue = [Waiter(job, i + 1, 10.0 + i) for i, job in enumerate(arrivals)]
    assert [w.job for w in order(Policy.LRS, queue, jobs, 20.0)] == expected
    first = pick(Policy.LRS, queue, jobs, 20.0)
    assert first is not None
    assert first.job == expected[0]


@pytest.mark.parametrize(
    ("arrivals", "now", "expected"),
    [
        # A train waiting on finished rollouts goes before another rollout.
        ([("a", "rollout", 0), ("b", "train", 5)], 10, ["b", "a"]),
        # A sync goes before a train; undeclared phases rank with rollout, by arrival.
        ([("a", "train", 0), ("b", "gen", 1), ("c", "sync", 2)], 10, ["c", "a", "b"]),
        ([("a", "gen", 0), ("b", "rollout", 1), ("c", "gen", 2)], 10, ["a", "b", "c"]),
        # Two trains: arrival order.
        ([("b", "train", 3), ("a", "train", 4)], 10, ["b", "a"]),
        # a's rollout has waited 300 s (the aging bound): it goes first.
        ([("a", "rollout", 0), ("b", "train", 250), ("c", "sync", 290)], 300, ["a", "c", "b"]),
        # Just short of the bound it does not.
        ([("a", "rollout", 0), ("b", "train", 250)], 299.9, ["b", "a"]),
        # Two aged waiters: oldest first whatever their kind.
        ([("a", "rollout", 0), ("b", "train", 10), ("c", "sync", 20)], 320, ["a", "b", "c"]),
    ],
)
def test_stage_serves_the_phase_that_unblocks_most_work_first_with_aging(
    arrivals: list[tuple[str, str, float]], now: float, expected: list[str]
) -> None:
    jobs = {job: _record(job) for job, _, _ in arrivals}
    queue = [Waiter(job, i + 1, since, phase) for i, (job, phase, since) in enumerate(arrivals)]
    got = order(Policy.STAGE, queue, jobs, now, phases=PHASES, stage_aging_seconds=300)
    assert [w.job for w in got] == expected
    first = pick(Policy.STAGE, queue, jobs, now, phases=PHASES, stage_aging_seconds=300)
    assert first is not None
    assert first.job == expected[0]


def test_stage_without_declared_phases_is_arrival_order() -> None:
    queue = [Waiter("a", 1, 0, "rollout"), Waiter("b", 2, 1, "train")]
    jobs = {"a": _record("a"), "b": _record("b")}
    assert [w.job for w in order(Policy.STAGE, queue, jobs, 5)] == ["a", "b"]


def test_stage_aging_follows_the_group_setting() -> None:
    queue = [Waiter("a", 1, 0, "rollout"), Waiter("b", 2, 5, "train")]
    jobs = {"a": _record("a"), "b": _record("b")}
    short = pick(Policy.STAGE, queue, jobs, 10, phases=PHASES, stage_aging_seconds=10)
    long = pick(Policy.STAGE, queue, jobs, 10, phases=PHASES, stage_aging_seconds=11)
    assert short is not None
    assert short.job == "a"
    assert long is not None
    assert long.job == "b"


def _serve_stream(policy: Policy, hold: float, aging: float) -> tuple[float, int]:
    """A rollout of job `r` waits while two train jobs keep coming back the moment their
    hold ends (each hold lasts `hold`). Returns when `r` is served and how many holds of
    others went before it."""
    now, ticket, served_r = 0.0, 3, None
    queue = [Waiter("r", 1, 0.0, "rollout"), Waiter("t1", 2, 0.0, "train")]
    # r's last hold has just ended; t1 never held the group; t2 holds it now.
    jobs = {"r": _record("r", 0.0), "t1": _record("t1"), "t2": _record("t2")}
    holder, holds = "t2", 0
    while served_r is None:
        assert holds < 1000, "the rollout was starved"
        now += hold
        jobs[holder] = _record(holder, now)  # its hold ended now
        queue.append(Waiter(holder, ticket, now, "train"))  # and it asks again at once
        ticket += 1
        chosen = pick(policy, queue, jobs, now, phases=PHASES, stage_aging_seconds=aging)
        assert chosen is not None
        queue.remove(chosen)
        if chosen.job == "r":
            served_r = now
        else:
            holder, holds = chosen.job, holds + 1
    return served_r, holds


@pytest.mark.parametrize(("hold", "aging"), [(7.0, 300.0), (30.0, 300.0), (1.0, 10.0)])
def test_stage_bounds_a_rollouts_wait_by_the_aging_and_one_hold(hold: float, aging: float) -> None:
    served, holds = _serve_stream(Policy.STAGE, hold, aging)
    # Trains always rank first, so the rollout waits until it ages, then at most the hold
    # under way when it aged (the trains that arrived before it aged are all newer).
    assert aging <= served <= aging + hold
    assert holds >= 1


@pytest.mark.parametrize("hold", [1.0, 30.0])
def test_lrs_bounds_a_wait_by_one_hold_of_each_other_job(hold: float) -> None:
    served, holds = _serve_stream(Policy.LRS, hold, 300.0)
    # Two other jobs: each is served at most once before the waiting rollout.
    assert holds <= 2
    assert served <= 3 * hold
