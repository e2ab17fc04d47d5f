"""Prefetch in the pure core: the head waiter restored beside the holder before it yields.

Case matrix (the driver's coordinator finds room unless told otherwise):
- a parked waiter behind a holder: a prefetch starts (no grant, holder not a candidate);
  done -> the waiter is resident; the holder's yield grants it at once, restored, with no
  switch; the timeline records prefetch started/done
- the holder yields while the prefetch runs: the grant waits for it, then comes at once
- a skipped prefetch (no room): nothing moves, not tried again for the same pair; a plain
  switch serves the waiter at the yield
- the waiter leaves (cancel) after its prefetch: an unprefetch parks it again
- the waiter leaves during its prefetch: parked again right after
- a failed prefetch: no retry, no failure for the waiter, it stays parked
- a waiter that never ran (idle) or is resident already: no prefetch
- a restart during a prefetch: it resumes, and the waiter's own Acquire does not take it
  for its switch
"""

from __future__ import annotations

from collections.abc import Callable

from rlslice.scheduler._proto import phase as group_phase
from rlslice.scheduler.core import Location, actions, events
from rlslice.scheduler.core.actions import Kind

from .conftest import Driver


def _b_parked_a_holding(new: Callable[..., Driver]) -> Driver:
    """a holds, b is parked (it held before a)."""
    d = new()
    d.register("a")
    d.register("b")
    d.acquire("b")
    d.finish_switch()
    d.acquire("a")
    d.apply(events.Yield("b"))
    d.finish_switch()  # b evicted for a
    assert d.state.holder == "a"
    assert d.state.location("b") is Location.PARKED
    d.prefetch_fits = True
    return d


def _prefetch_records(d: Driver) -> list[str]:
    return [
        f"{r.job}:{r.detail}"
        for r in d.log
        if isinstance(r, actions.Record) and r.kind is Kind.PREFETCH
    ]


def test_a_parked_waiter_is_restored_beside_the_holder_and_granted_at_its_yield(
    new: Callable[..., Driver],
) -> None:
    d = _b_parked_a_holding(new)
    d.acquire("b")
    switch = d.state.switch
    assert switch is not None
    assert (switch.purpose, switch.incoming, switch.ticket) == ("prefetch", "b", None)
    assert group_phase(d.state) == "Held"  # a prefetch beside the holder is not a switch
    assert "a" not in switch.candidates  # the holder is never evicted for a prefetch
    assert switch.restore is True
    grants = len(d.grants)

    d.apply(events.SwitchDone(switch.epoch, (), moved_bytes=100, seconds=0.2))

    assert len(d.grants) == grants  # no grant: a still holds
    assert d.state.holder == "a"
    assert d.state.location("b") is Location.RESIDENT
    assert d.state.prefetched == ("b",)
    out = d.apply(events.Yield("a"))
    assert not any(isinstance(x, actions.StartSwitch) for x in out)
    grant = d.grants[-1]
    assert (grant.job, grant.restored, grant.moved_bytes) == ("b", True, 0)
    assert d.state.holder == "b"
    assert d.state.prefetched == ()
    assert d.state.location("a") is Location.RESIDENT  # nothing evicted
    assert _prefetch_records(d) == ["b:started", "b:done"]


def test_a_yield_during_the_prefetch_waits_for_it_then_grants_at_once(
    new: Callable[..., Driver],
) -> None:
    d = _b_parked_a_holding(new)
    d.acquire("b")
    switch = d.state.switch
    assert switch is not None
    d.apply(events.Yield("a"))
    assert d.state.holder is None
    assert d.state.switch == switch  # no second switch while the prefetch runs
    d.apply(events.SwitchDone(switch.epoch, (), moved_bytes=100))
    assert d.state.holder == "b"
    assert d.grants[-1].restored is True
    assert d.state.switch is None


def test_a_prefetch_that_does_not_fit_moves_nothing_and_is_not_tried_again(
    new: Callable[..., Driver],
) -> None:
    d = _b_parked_a_holding(new)
    d.prefetch_fits = False
    d.acquire("b")
    assert d.state.switch is None
    assert d.state.unfit == ("a", "b")
    assert _prefetch_records(d) == ["b:started", "b:skipped: no room (driver)"]
    d.advance(1.0)  # a tick serves again: the same pair is not tried twice
    assert _prefetch_records(d) == ["b:started", "b:skipped: no room (driver)"]
    d.apply(events.Yield("a"))
    switch = d.state.switch
    assert switch is not None
    assert switch.purpose == "grant"
    assert switch.candidates == ("a",)
    d.finish_switch()
    assert d.state.holder == "b"


def test_a_waiter_that_leaves_after_its_prefetch_is_parked_again(
    new: Callable[..., Driver],
) -> None:
    d = _b_parked_a_holding(new)
    ticket = d.acquire("b")
    switch = d.state.switch
    assert switch is not None
    d.apply(events.SwitchDone(switch.epoch, (), moved_bytes=100))
    d.cancel(ticket)
    undo = d.state.switch
    assert undo is not None
    assert (undo.purpose, undo.incoming, undo.evict, undo.restore) == (
        "unprefetch",
        "b",
        ("b",),
        False,
    )
    d.apply(events.SwitchDone(undo.epoch, ("b",), moved_bytes=100))
    assert d.state.location("b") is Location.PARKED
    assert d.state.prefetched == ()
    assert d.state.holder == "a"
    assert _prefetch_records(d)[-2:] == ["b:undoing", "b:undone"]


def test_a_waiter_that_leaves_during_its_prefetch_is_parked_again_right_after(
    new: Callable[..., Driver],
) -> None:
    d = _b_parked_a_holding(new)
    ticket = d.acquire("b")
    switch = d.state.switch
    assert switch is not None
    d.cancel(ticket)
    assert d.state.switch == switch  # a prefetch cannot stop half-way
    d.apply(events.SwitchDone(switch.epoch, (), moved_bytes=100))
    undo = d.state.switch
    assert undo is not None
    assert undo.purpose == "unprefetch"


def test_a_failed_prefetch_is_not_retried_and_fails_nobody(new: Callable[..., Driver]) -> None:
    d = _b_parked_a_holding(new)
    d.acquire("b")
    switch = d.state.switch
    assert switch is not None
    d.apply(events.RestoreFailed(switch.epoch, "node n1: bytes do not fit"))
    assert d.state.switch is None
    assert d.fails == []
    assert d.state.location("b") is Location.PARKED
    assert d.state.faulted == {}
    assert _prefetch_records(d)[-1] == "b:failed: node n1: bytes do not fit"


def test_no_prefetch_for_a_waiter_that_never_ran_or_is_resident(
    new: Callable[..., Driver],
) -> None:
    d = new()
    d.prefetch_fits = True
    d.register("a")
    d.register("b")
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")  # idle: nothing parked to bring ahead
    assert d.state.switch is None
    d.apply(events.Yield("a"))
    d.finish_switch(evict_all=False)  # b joins a on the GPUs
    d.acquire("a")  # resident already: nothing to prefetch
    assert d.state.switch is None
    assert _prefetch_records(d) == []


def test_a_restart_resumes_a_prefetch_and_the_waiters_acquire_does_not_take_it(
    new: Callable[..., Driver],
) -> None:
    d = _b_parked_a_holding(new)
    d.acquire("b")
    switch = d.state.switch
    assert switch is not None
    out = d.apply(events.Recover())
    assert actions.StartSwitch(d.state.switch, resume=True) in out  # type: ignore[arg-type]
    d.open_calls.clear()
    d.acquire("b")  # the caller is back: its place in the queue, not the prefetch
    assert d.state.switch is not None
    assert d.state.switch.ticket is None
    assert [w.job for w in d.state.queue] == ["b"]
    d.apply(events.SwitchDone(switch.epoch, (), moved_bytes=100))
    d.apply(events.Yield("a"))
    assert d.state.holder == "b"
