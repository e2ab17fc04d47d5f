"""A switch whose node was cut off mid-call: what the node did is unknown, so the jobs it
was asked to snapshot (and any whose rollback failed) count as parked.

Cases:
- the outgoing job of a failed switch, reported unsure, is parked in the scheduler's view:
  its next acquire goes through a switch (which asks the agents and restores it where it
  is parked) instead of a grant that moves nothing and would leave it holding frozen;
- without unsure jobs a failed switch leaves placement as it was (the resident job is
  granted at once, as before);
- a preempted holder reported unsure is not made holder again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlslice._errors import AbortedError
from rlslice.scheduler.core import Location, events

if TYPE_CHECKING:
    from conftest import Driver


def _b_resident_a_waits(new: Callable[..., Driver]) -> Driver:
    d = new()
    d.register("a")
    d.register("b")
    d.acquire("a")
    d.finish_switch()
    d.apply(events.Yield("a"))
    d.acquire("b")
    d.finish_switch()  # a parked, b resident and holding
    d.acquire("a")
    d.apply(events.Yield("b"))
    return d


def _fail_twice(d: Driver, unsure: tuple[str, ...]) -> None:
    for _ in range(2):
        switch = d.state.switch
        assert switch is not None
        d.apply(events.SnapshotFailed(switch.epoch, "node n1: cut off", AbortedError, unsure))


def test_an_unsure_outgoing_job_is_restored_through_a_switch_at_its_next_acquire(
    new: Callable[..., Driver],
) -> None:
    d = _b_resident_a_waits(new)
    _fail_twice(d, ("b",))
    assert d.fails[-1].job == "a"
    assert d.state.location("b") is Location.PARKED
    grants = len(d.grants)
    d.acquire("b")
    assert len(d.grants) == grants  # not granted as resident: a switch asks the agents
    assert d.state.switch is not None
    assert d.state.switch.incoming == "b"
    assert d.state.switch.restore


def test_without_unsure_jobs_placement_stays(new: Callable[..., Driver]) -> None:
    d = _b_resident_a_waits(new)
    _fail_twice(d, ())
    assert d.state.location("b") is Location.RESIDENT
    d.acquire("b")
    assert d.state.holder == "b"


def test_an_unsure_preempted_holder_does_not_hold_again(new: Callable[..., Driver]) -> None:
    d = new(max_hold_seconds=5.0, yield_grace_seconds=1.0)
    d.register("a", lease=600)
    d.register("b", lease=600)
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    d.advance(5)
    d.advance(1)  # preempted: a switch evicts a
    switch = d.state.switch
    assert switch is not None
    assert switch.preempted == "a"
    _fail_twice(d, ("a",))
    assert d.state.holder is None
    assert d.state.location("a") is Location.PARKED
