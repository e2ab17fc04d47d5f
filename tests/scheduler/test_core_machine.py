"""The group state machine, scenario by scenario.

Cases: an idle job's first acquire switches (nothing to restore), then a resident job is
granted at once; a second job queues and gets the lock when the holder yields; a yield
without waiters defers the snapshot; a parked job is restored; duplicate acquire, yield by
a non-holder, duplicate register and acquire by a stranger are refused with the state
unchanged; a cancelled waiter leaves the queue at once, also during its switch; a lapsed
holder loses the lock and its waiters fail; unregister releases state with force; snapshot
failure retries once then fails the waiter; restore failure retries then faults the job and
serves the next waiter; max-hold asks the holder to yield, then preempts it and the
preempted job's later yield is accepted; a failed preemption gives the lock back; a put
replaces the spec; delete is refused while held unless forced; recover detaches waiters,
who rejoin in place; deadlines cover leases and the hold limit; epochs only rise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from rlslice._errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from rlslice.config import GroupSpec
from rlslice.scheduler.core import (
    MAX_SWITCH_ATTEMPTS,
    Location,
    actions,
    deadline,
    events,
    keepalive_answer,
    step,
)

if TYPE_CHECKING:
    from conftest import Driver


def _two_jobs_a_holding(new: Callable[..., Driver]) -> Driver:
    d = new()
    d.register("a")
    d.register("b")
    d.acquire("a")
    d.finish_switch()
    return d


def test_an_idle_jobs_first_acquire_switches_then_resident_acquires_are_immediate(
    new: Callable[..., Driver],
) -> None:
    d = new()
    d.register("a")
    d.acquire("a")
    assert d.state.switch is not None
    assert d.state.switch.restore is False
    d.finish_switch()
    assert d.state.holder == "a"
    assert d.grants[-1].restored is False
    d.apply(events.Yield("a"))
    d.acquire("a")
    assert d.state.holder == "a"
    assert d.state.switch is None
    assert len(d.grants) == 2


def test_a_waiter_gets_the_lock_when_the_holder_yields(new: Callable[..., Driver]) -> None:
    d = _two_jobs_a_holding(new)
    ticket = d.acquire("b")
    assert [w.job for w in d.state.queue] == ["b"]
    out = d.apply(events.Yield("a"))
    assert actions.Yielded("a", 1, snapshot_deferred=False) in out
    assert d.state.switch is not None
    assert d.state.switch.candidates == ("a",)
    d.finish_switch()
    assert d.state.holder == "b"
    assert d.grants[-1].ticket == ticket
    assert d.state.location("a") is Location.PARKED


def test_a_yield_without_waiters_defers_the_snapshot(new: Callable[..., Driver]) -> None:
    d = _two_jobs_a_holding(new)
    out = d.apply(events.Yield("a"))
    assert actions.Yielded("a", 0, snapshot_deferred=True) in out
    assert d.state.holder is None
    assert d.state.location("a") is Location.RESIDENT
    assert not any(isinstance(x, actions.StartSwitch) for x in out)


def test_a_parked_job_is_restored_for_its_grant(new: Callable[..., Driver]) -> None:
    d = _two_jobs_a_holding(new)
    d.acquire("b")
    d.apply(events.Yield("a"))
    d.finish_switch()
    d.acquire("a")
    d.apply(events.Yield("b"))
    assert d.state.switch is not None
    assert d.state.switch.restore is True
    d.finish_switch()
    assert d.grants[-1].restored is True
    assert d.state.location("b") is Location.PARKED


def test_a_coresident_waiter_is_granted_without_a_switch(new: Callable[..., Driver]) -> None:
    d = _two_jobs_a_holding(new)
    d.acquire("b")
    d.apply(events.Yield("a"))
    d.finish_switch(evict_all=False)  # b fitted beside a
    assert d.state.resident == ("a", "b")
    d.apply(events.Yield("b"))
    d.acquire("a")
    assert d.state.holder == "a"
    assert d.state.switch is None


@pytest.mark.parametrize(
    ("event", "error"),
    [
        (events.Yield("b"), FailedPreconditionError),
        (events.Register("a", "x", "h", 30), AlreadyExistsError),
        (events.Acquire("stranger", 99), FailedPreconditionError),
        (events.KeepAlive("stranger"), FailedPreconditionError),
        (events.PutGroup(GroupSpec(name="other")), InvalidArgumentError),
        (events.DeleteGroup(force=False), FailedPreconditionError),
    ],
)
def test_refused_events_raise_and_leave_the_state_alone(
    new: Callable[..., Driver], event: events.Event, error: type[Exception]
) -> None:
    d = _two_jobs_a_holding(new)
    before = d.state
    with pytest.raises(error):
        step(before, event, d.now)
    assert d.state is before


def test_a_second_acquire_while_waiting_is_refused(new: Callable[..., Driver]) -> None:
    d = _two_jobs_a_holding(new)
    d.acquire("b")
    with pytest.raises(AlreadyExistsError, match="already waiting"):
        d.acquire("b")
    assert len(d.state.queue) == 1


def test_a_cancelled_waiter_leaves_the_queue_at_once(new: Callable[..., Driver]) -> None:
    d = _two_jobs_a_holding(new)
    ticket = d.acquire("b")
    d.cancel(ticket)
    assert d.state.queue == ()
    out = d.apply(events.Yield("a"))
    assert actions.Yielded("a", 0, snapshot_deferred=True) in out


def test_a_late_cancel_of_an_old_call_does_not_remove_a_newer_one(
    new: Callable[..., Driver],
) -> None:
    d = _two_jobs_a_holding(new)
    old = d.acquire("b")
    d.cancel(old)
    d.acquire("b")
    d.apply(events.Cancel("b", old))
    assert [w.job for w in d.state.queue] == ["b"]


def test_a_waiter_cancelled_during_its_switch_ends_resident_not_holding(
    new: Callable[..., Driver],
) -> None:
    d = _two_jobs_a_holding(new)
    ticket = d.acquire("b")
    d.apply(events.Yield("a"))
    d.cancel(ticket)
    d.finish_switch()
    assert d.state.holder is None
    assert d.state.location("b") is Location.RESIDENT


def test_a_lapsed_holder_loses_the_lock_and_the_next_waiter_is_served(
    new: Callable[..., Driver],
) -> None:
    d = new()
    d.register("a", lease=5)
    d.register("b", lease=60)
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    assert deadline(d.state) == pytest.approx(d.now + 5)
    out = d.advance(5)
    assert d.state.holder is None
    assert "a" not in d.state.jobs
    # Fenced first (it may still run, unreachable): released only once the switch held.
    assert actions.ReleaseState("a", force=False) not in out
    assert d.state.switch is not None
    assert d.state.switch.incoming == "b"
    assert d.state.switch.fence == ("a",)
    d.finish_switch()
    assert actions.ReleaseState("a", force=False) in d.log
    assert d.state.holder == "b"


def test_a_lapsed_waiter_fails_with_unavailable(new: Callable[..., Driver]) -> None:
    d = _two_jobs_a_holding(new)
    d.apply(events.KeepAlive("a"))
    d.now += 10
    d.apply(events.KeepAlive("a"))
    d.acquire("b")
    d.advance(25)
    assert d.fails[-1].kind is UnavailableError
    assert "lease lapsed" in d.fails[-1].reason
    assert d.state.queue == ()
    assert d.state.holder == "a"


def test_unregister_drops_the_job_and_releases_its_state_by_force(
    new: Callable[..., Driver],
) -> None:
    d = _two_jobs_a_holding(new)
    out = d.apply(events.Unregister("a"))
    assert actions.ReleaseState("a", force=True) in out
    assert d.state.holder is None
    assert "a" not in d.state.resident


def test_a_failed_snapshot_is_retried_once_then_the_waiter_fails(
    new: Callable[..., Driver],
) -> None:
    d = _two_jobs_a_holding(new)
    ticket = d.acquire("b")
    d.apply(events.Yield("a"))
    for attempt in range(1, MAX_SWITCH_ATTEMPTS + 1):
        sw = d.state.switch
        assert sw is not None
        assert sw.attempt == attempt
        d.apply(events.SnapshotFailed(sw.epoch, "node n2 unreachable"))
    assert d.state.switch is None
    assert d.fails[-1].ticket == ticket
    assert d.fails[-1].kind is UnavailableError
    assert "n2 unreachable" in d.fails[-1].reason
    assert d.state.location("a") is Location.RESIDENT


def test_a_failed_restore_is_retried_then_faults_the_job_and_serves_the_next(
    new: Callable[..., Driver],
) -> None:
    d = new()
    for job in "abc":
        d.register(job)
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    d.apply(events.Yield("a"))
    d.finish_switch()  # b holds, a parked
    d.acquire("a")
    d.acquire("c")
    d.apply(events.Yield("b"))
    sw = d.state.switch
    assert sw is not None
    assert sw.incoming == "a"
    d.apply(events.RestoreFailed(sw.epoch, "bad bytes", evicted=("b",)))
    sw = d.state.switch
    assert sw is not None
    assert (sw.attempt, sw.restore, sw.candidates) == (2, True, ())
    d.apply(events.RestoreFailed(sw.epoch, "bad bytes"))
    assert d.state.location("a") is Location.FAULTED
    assert d.state.faulted["a"] == "bad bytes"
    assert d.fails[-1].kind is FailedPreconditionError
    assert d.state.switch is not None
    assert d.state.switch.incoming == "c"
    d.finish_switch()
    assert d.state.holder == "c"


def test_a_faulted_job_retries_its_restore_on_its_next_acquire(new: Callable[..., Driver]) -> None:
    d = _state_with_a_faulted(new)
    d.acquire("a")
    assert d.state.switch is not None
    assert d.state.switch.restore is True


def _state_with_a_faulted(new: Callable[..., Driver]) -> Driver:
    d = _two_jobs_a_holding(new)
    d.acquire("b")
    d.apply(events.Yield("a"))
    d.finish_switch()
    d.apply(events.Yield("b"))
    d.acquire("a")
    for _ in range(MAX_SWITCH_ATTEMPTS):
        sw = d.state.switch
        assert sw is not None
        d.apply(events.RestoreFailed(sw.epoch, "boom"))
    assert d.state.location("a") is Location.FAULTED
    return d


def test_a_holder_past_max_hold_is_asked_to_yield_then_preempted(
    new: Callable[..., Driver],
) -> None:
    d = new(max_hold_seconds=10, yield_grace_seconds=5)
    d.register("a", lease=100)
    d.register("b", lease=100)
    d.acquire("a")
    d.finish_switch()
    d.now += 20
    d.acquire("b")  # a is past its limit already: asked at once
    assert d.state.yield_requested_at == d.now
    assert keepalive_answer(d.state, "a", d.now)[1:] == (True, 5.0)
    assert deadline(d.state) == pytest.approx(d.now + 5)
    out = d.advance(5)
    assert actions.Preempt("a") in out
    sw = d.state.switch
    assert sw is not None
    assert (sw.incoming, sw.evict, sw.preempted) == ("b", ("a",), "a")
    assert d.state.holder is None
    d.finish_switch(evict_all=False)
    assert d.state.holder == "b"
    assert d.state.location("a") is Location.PARKED
    assert keepalive_answer(d.state, "a", d.now)[1] is True
    out = d.apply(events.Yield("a"))  # the preempted job's late yield is fine
    assert actions.Yielded("a", 0, snapshot_deferred=False) in out
    d.acquire("a")
    d.apply(events.Yield("b"))
    assert d.state.switch is not None
    assert d.state.switch.restore is True


def test_no_yield_is_requested_while_nobody_waits(new: Callable[..., Driver]) -> None:
    d = new(max_hold_seconds=10)
    d.register("a", lease=100)
    d.acquire("a")
    d.finish_switch()
    d.advance(50)
    assert d.state.yield_requested_at is None
    assert "yield_requested" not in d.kinds()


def test_a_failed_preemption_gives_the_lock_back_to_the_victim(new: Callable[..., Driver]) -> None:
    d = new(max_hold_seconds=10, yield_grace_seconds=5)
    d.register("a", lease=100)
    d.register("b", lease=100)
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    d.advance(10)
    d.advance(5)
    for _ in range(MAX_SWITCH_ATTEMPTS):
        sw = d.state.switch
        assert sw is not None
        d.apply(events.SnapshotFailed(sw.epoch, "freeze refused"))
    assert d.state.holder == "a"
    assert "a" not in d.state.preempted
    assert d.state.yield_requested_at == d.now


def test_put_group_replaces_the_spec_and_delete_needs_force_while_held(
    new: Callable[..., Driver],
) -> None:
    d = _two_jobs_a_holding(new)
    d.apply(events.PutGroup(GroupSpec(name="g", max_hold_seconds=5)))
    assert d.state.spec.max_hold_seconds == 5
    ticket = d.acquire("b")
    transition = step(d.state, events.DeleteGroup(force=True), d.now)
    assert transition.state is None
    fails = [x for x in transition.actions if isinstance(x, actions.Fail)]
    assert [(f.ticket, f.kind) for f in fails] == [(ticket, NotFoundError)]
    releases = {x.job for x in transition.actions if isinstance(x, actions.ReleaseState)}
    assert releases == {"a", "b"}


def test_recover_detaches_waiters_who_rejoin_in_place_and_resumes_a_switch(
    new: Callable[..., Driver],
) -> None:
    d = new()
    for job in "abc":
        d.register(job)
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    d.acquire("c")
    d.open_calls.clear()  # the restart dropped every call
    d.now += 100
    d.apply(events.Recover())
    assert all(not w.attached for w in d.state.queue)
    assert all(r.expires_at >= d.now + 30 for r in d.state.jobs.values())
    d.apply(events.Yield("a"))
    assert d.state.switch is None  # nobody connected to serve
    ticket = d.acquire("c")
    assert d.state.switch is not None
    assert d.state.switch.incoming == "c"
    assert d.state.switch.ticket == ticket
    sw = d.state.switch
    d.open_calls.clear()
    out = d.apply(events.Recover())
    resumed = sw.__class__(**{**_fields(sw), "ticket": None, "detached": True})
    assert actions.StartSwitch(resumed, resume=True) in out
    # The switch ends in a grant to c, though c has not called again yet.
    d.finish_switch()
    assert d.state.holder == "c"


def _fields(obj: object) -> dict[str, object]:
    return {name: getattr(obj, name) for name in obj.__slots__}  # type: ignore[attr-defined]


def test_epochs_only_rise_and_every_grant_has_a_new_one(new: Callable[..., Driver]) -> None:
    d = _two_jobs_a_holding(new)
    for _ in range(5):
        d.acquire("b")
        d.apply(events.Yield("a"))
        d.finish_switch()
        d.acquire("a")
        d.apply(events.Yield("b"))
        d.finish_switch()
    epochs = [g.epoch for g in d.grants]
    assert epochs == sorted(set(epochs))


def test_a_stale_coordinator_report_changes_nothing(new: Callable[..., Driver]) -> None:
    d = _two_jobs_a_holding(new)
    before = d.state
    out = d.apply(events.SwitchDone(epoch=12345))
    assert out == ()
    assert d.state is before
