"""Invariants of the group state machine over random event sequences (hypothesis).

After every accepted event: at most one job believes it holds (preempted jobs aside) and it
is the state's holder; every open acquire is either queued or the switch's waiter (no ghost,
none lost); no job is queued twice or queued while holding or switching in; resident, parked
and faulted are disjoint and registered; a cancelled waiter is out of the queue at once;
after a Tick no live lease is past its expiry (a lapsed holder has lost the lock); epochs
never fall and every grant carries a new, higher epoch. At the end, completing switches and
letting every lease lapse answers every open acquire (granted or failed with a reason).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlslice._errors import RlsliceError
from rlslice.config import Policy
from rlslice.scheduler.core import actions, events

if TYPE_CHECKING:
    from conftest import Driver

JOBS = ["a", "b", "c", "d"]
job = st.sampled_from(JOBS)
op = st.one_of(
    st.tuples(st.just("register"), job, st.sampled_from([3.0, 10.0, 60.0])),
    st.tuples(st.just("unregister"), job),
    st.tuples(st.just("acquire"), job),
    st.tuples(st.just("acquire"), job),
    st.tuples(st.just("cancel"), job),
    st.tuples(st.just("yield"), job),
    st.tuples(st.just("yield"), job),
    st.tuples(st.just("keepalive"), job),
    st.tuples(st.just("lost_grant"), job),
    st.tuples(st.just("tick"), st.floats(0, 12)),
    st.tuples(st.just("done"), st.booleans()),
    st.tuples(st.just("done"), st.booleans()),
    st.tuples(st.just("snapshot_failed")),
    st.tuples(st.just("restore_failed")),
    st.tuples(st.just("recover")),
)
spec = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(list(Policy)),
        "max_hold_seconds": st.sampled_from([0.0, 5.0]),
        "yield_grace_seconds": st.sampled_from([1.0, 4.0]),
    }
)


def _check(d: Driver, believed: set[str]) -> None:
    s = d.state
    queued = [w.job for w in s.queue]
    assert len(queued) == len(set(queued)), "a job is queued twice"
    assert s.holder not in queued, "the holder is queued"
    if s.switch is not None:
        assert s.switch.incoming not in queued
        assert s.holder is None, "a switch runs while someone holds"
    live_tickets = {w.ticket for w in s.queue if w.attached}
    if s.switch is not None and s.switch.ticket is not None:
        live_tickets.add(s.switch.ticket)
    assert set(d.open_calls) == live_tickets, "an open acquire is lost, or a ghost is queued"
    holders = believed - s.preempted
    assert len(holders) <= 1, f"two holders: {holders}"
    assert holders == ({s.holder} if s.holder else set())
    if s.acknowledged is not None:
        assert s.acknowledged[0] == s.holder, "an acknowledgement outlived its hold"
    places = [set(s.resident), set(s.parked), set(s.faulted)]
    for i, left in enumerate(places):
        assert left <= set(s.jobs)
        for right in places[i + 1 :]:
            assert not left & right


def _run(d: Driver, ops: list[tuple[object, ...]]) -> None:
    believed: set[str] = set()
    last_epoch = d.state.epoch
    tickets: dict[str, int] = {}
    for item in ops:
        name = item[0]
        grants_before = len(d.grants)
        try:
            if name == "register":
                d.register(str(item[1]), lease=float(item[2]))  # type: ignore[arg-type]
            elif name == "unregister":
                d.apply(events.Unregister(str(item[1])))
                believed.discard(str(item[1]))
            elif name == "acquire":
                tickets[str(item[1])] = d.acquire(str(item[1]))
            elif name == "cancel":
                ticket = tickets.get(str(item[1]))
                if ticket in d.open_calls:
                    d.cancel(ticket)
                    assert ticket not in {w.ticket for w in d.state.queue}
            elif name == "yield":
                d.apply(events.Yield(str(item[1])))
                believed.discard(str(item[1]))
            elif name == "keepalive":
                d.apply(events.KeepAlive(str(item[1])))
            elif name == "lost_grant":
                # The caller of the current grant left unread: it never learnt it held.
                done = d.apply(events.LostGrant(str(item[1]), d.state.epoch))
                if any(isinstance(x, actions.Yielded) for x in done):
                    believed.discard(str(item[1]))
            elif name == "tick":
                d.advance(float(item[1]))  # type: ignore[arg-type]
                assert all(r.expires_at > d.now for r in d.state.jobs.values())
            elif name == "done" and d.state.switch is not None:
                d.finish_switch(evict_all=bool(item[1]))
            elif name == "snapshot_failed" and d.state.switch is not None:
                d.apply(events.SnapshotFailed(d.state.switch.epoch, "injected"))
            elif name == "restore_failed" and d.state.switch is not None:
                d.apply(events.RestoreFailed(d.state.switch.epoch, "injected"))
            elif name == "recover":
                d.open_calls.clear()
                d.apply(events.Recover())
        except RlsliceError:
            pass
        believed &= set(d.state.jobs)  # a lapsed or unregistered job knows it lost everything
        for grant in d.grants[grants_before:]:
            believed.add(grant.job)
        assert d.state.epoch >= last_epoch, "the epoch fell"
        last_epoch = d.state.epoch
        _check(d, believed)
    epochs = [g.epoch for g in d.grants]
    assert epochs == sorted(set(epochs)), "a grant reused or lowered an epoch"


# `new` is a stateless factory: sharing it between examples is safe.
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(spec=spec, ops=st.lists(op, max_size=60))
def test_random_event_sequences_keep_every_invariant(
    new: Callable[..., Driver], spec: dict[str, object], ops: list[tuple[object, ...]]
) -> None:
    d = new(**spec)
    _run(d, ops)
    # Drain: finish switches, let every lease lapse; every open acquire gets an answer.
    for _ in range(20):
        if d.state.switch is not None:
            d.finish_switch()
        else:
            d.advance(100)
    assert d.state.jobs == {}
    assert d.open_calls == {}, "an acquire was never answered"
    assert all(f.reason for f in d.fails), "a failure without a reason"
