"""Early yield of a rollout and the RL policies, through the state machine.

Cases (the yield-request rule as a table): a `rollout` holder is asked to yield when the
policy's next waiter is a `train`, with no preemption following (infinite seconds); a
`train` holder is never asked; a `rollout` or `sync` or undeclared waiter asks nothing;
undeclared holder phases, `early_yield: false` and a detached train waiter ask nothing;
under fifo a rollout queued before the train asks nothing (it would be served, not the
train); the request ends once the train is served. Job records keep the phase waited for
and when the last hold ended; lrs and stage serve in their order through `step`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from rlslice.config import PhaseKind, PhaseSpec, Policy
from rlslice.scheduler.core import (
    YieldReason,
    early_yield_for,
    events,
    keepalive_answer,
    yield_reason,
)

if TYPE_CHECKING:
    from conftest import Driver

PHASES = {
    "rollout": PhaseSpec(kind=PhaseKind.ROLLOUT, expected_seconds=120),
    "train": PhaseSpec(kind=PhaseKind.TRAIN, expected_seconds=30),
    "sync": PhaseSpec(kind=PhaseKind.SYNC, expected_seconds=2),
}


def _holding(new: Callable[..., Driver], phase: str, **spec: object) -> Driver:
    d = new(phases=PHASES, **spec)
    for job in ("a", "b", "c"):
        d.register(job, lease=100)
    d.acquire("a", phase)
    d.finish_switch()
    assert d.state.holder == "a"
    return d


@pytest.mark.parametrize(
    ("policy", "holder_phase", "waiting", "asked"),
    [
        (Policy.STAGE, "rollout", [("b", "train")], True),
        (Policy.FIFO, "rollout", [("b", "train")], True),
        (Policy.LRS, "rollout", [("b", "train")], True),
        # Stage puts the train first even behind an earlier rollout.
        (Policy.STAGE, "rollout", [("c", "rollout"), ("b", "train")], True),
        # Fifo would serve the earlier rollout, not the train: nothing to make way for.
        (Policy.FIFO, "rollout", [("c", "rollout"), ("b", "train")], False),
        # A train holder is never asked; nor for a rollout, sync or undeclared waiter.
        (Policy.STAGE, "train", [("b", "train")], False),
        (Policy.STAGE, "rollout", [("b", "rollout")], False),
        (Policy.STAGE, "rollout", [("b", "sync")], False),
        (Policy.STAGE, "rollout", [("b", "eval")], False),
        # An undeclared holder phase behaves as before: never asked early.
        (Policy.STAGE, "generate", [("b", "train")], False),
        (Policy.STAGE, "sync", [("b", "train")], False),
    ],
)
def test_a_rollout_holder_is_asked_to_yield_only_when_a_train_is_served_next(
    new: Callable[..., Driver],
    policy: Policy,
    holder_phase: str,
    waiting: list[tuple[str, str]],
    asked: bool,
) -> None:
    d = _holding(new, holder_phase, policy=policy)
    for job, phase in waiting:
        d.acquire(job, phase)
    ttl, requested, preempt_in = keepalive_answer(d.state, "a", d.now)
    assert requested is asked
    assert (yield_reason(d.state, "a", d.now) is YieldReason.TRAIN_WAITING) is asked
    if asked:
        assert math.isinf(preempt_in)  # nothing preempts an early yield
        waiter = early_yield_for(d.state, d.now)
        assert waiter is not None
        assert waiter.job == "b"
    assert ttl > 0
    for job, _ in waiting:  # a waiter is never asked to yield
        assert keepalive_answer(d.state, job, d.now)[1] is False


def test_early_yield_is_off_when_the_group_says_so(new: Callable[..., Driver]) -> None:
    d = _holding(new, "rollout", early_yield=False)
    d.acquire("b", "train")
    assert keepalive_answer(d.state, "a", d.now)[1] is False


def test_a_detached_train_waiter_asks_nothing_until_it_comes_back(
    new: Callable[..., Driver],
) -> None:
    d = _holding(new, "rollout")
    ticket = d.acquire("b", "train")
    d.apply(events.Recover())  # a scheduler restart detaches the waiter
    d.open_calls.pop(ticket)
    assert keepalive_answer(d.state, "a", d.now)[1] is False
    d.acquire("b", "train")
    assert keepalive_answer(d.state, "a", d.now)[1] is True


def test_the_request_ends_when_the_rollout_yields_and_never_preempts(
    new: Callable[..., Driver],
) -> None:
    d = _holding(new, "rollout", max_hold_seconds=0)
    d.acquire("b", "train")
    out = d.advance(90)  # long after any grace (leases last 100 s): still no preemption
    assert not any(type(a).__name__ == "Preempt" for a in out)
    assert d.state.holder == "a"
    assert d.state.yield_requested_at is None
    d.apply(events.Yield("a"))
    d.finish_switch()
    assert d.state.holder == "b"
    assert keepalive_answer(d.state, "a", d.now)[1] is False
    assert keepalive_answer(d.state, "b", d.now)[1] is False  # a train holder


def test_max_hold_keeps_its_reason_and_its_grace_over_an_early_request(
    new: Callable[..., Driver],
) -> None:
    d = _holding(new, "rollout", max_hold_seconds=10, yield_grace_seconds=5)
    d.now += 20
    d.acquire("b", "train")
    assert yield_reason(d.state, "a", d.now) is YieldReason.MAX_HOLD
    assert keepalive_answer(d.state, "a", d.now)[1:] == (True, 5.0)


def test_job_records_keep_the_phase_waited_for_and_when_the_last_hold_ended(
    new: Callable[..., Driver],
) -> None:
    d = _holding(new, "rollout")
    assert d.state.jobs["a"].phase == "rollout"
    assert d.state.jobs["a"].last_served_at is None
    d.acquire("b", "train")
    assert d.state.jobs["b"].phase == "train"
    d.now += 7
    d.apply(events.Yield("a"))
    assert d.state.jobs["a"].last_served_at == d.now
    assert d.state.jobs["b"].last_served_at is None


def _served_order(d: Driver, waiting: list[tuple[str, str]]) -> list[str]:
    for job, phase in waiting:
        d.now += 1
        d.acquire(job, phase)
    served = []
    while d.state.queue or d.state.switch is not None:
        if d.state.switch is not None:
            d.finish_switch()
        holder = d.state.holder
        assert holder is not None
        served.append(holder)
        d.now += 1
        d.apply(events.Yield(holder))
    if d.state.switch is not None:
        d.finish_switch()
    return served


def test_stage_serves_a_waiting_train_before_an_earlier_rollout(
    new: Callable[..., Driver],
) -> None:
    d = _holding(new, "rollout", policy=Policy.STAGE)
    assert _served_order(d, [("c", "rollout"), ("b", "train")]) == ["a", "b", "c"]


def test_fifo_serves_the_same_waiters_in_arrival_order(new: Callable[..., Driver]) -> None:
    d = _holding(new, "rollout", policy=Policy.FIFO)
    assert _served_order(d, [("c", "rollout"), ("b", "train")]) == ["a", "c", "b"]


def test_lrs_serves_the_job_served_longest_ago_first(new: Callable[..., Driver]) -> None:
    d = _holding(new, "rollout", policy=Policy.LRS)
    # b held and yielded before c did; then c and b wait (c queued first): b goes first.
    d.apply(events.Yield("a"))
    for job in ("b", "c"):
        d.acquire(job, "rollout")
        if d.state.switch is not None:
            d.finish_switch()
        d.now += 1
        d.apply(events.Yield(job))
    d.acquire("a", "rollout")
    d.finish_switch()
    assert _served_order(d, [("c", "rollout"), ("b", "rollout")]) == ["a", "b", "c"]
