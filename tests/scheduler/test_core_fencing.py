"""Fencing in the pure core: a holder whose lease lapses may still run (partitioned from
the scheduler, alive on its node), so nobody else is granted the group until a switch has
snapshotted it on every node (DESIGN.md invariant 7).

Cases:
- a lapsed holder with a resident waiter: no immediate grant; a switch fences it (in
  `evict` and `fence`), the waiter is granted after it, the lapsed job released after it;
- a lapsed holder and no waiter: nothing moves; the first waiter to come triggers the fence;
- the fence snapshot fails: nobody is granted, the waiter fails with the reason after the
  retry, the fence stays pending and the next waiter's switch fences again;
- a restore that fails after the fence held: the fence counts, the job is released;
- the lapsed holder registers again under its name and is served first: no fence of itself;
- the pending fence survives the store's encoding (a scheduler restart).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlslice._errors import AbortedError
from rlslice.scheduler.core import actions, events
from rlslice.scheduler.store.codec import decode_group, encode_group

if TYPE_CHECKING:
    from conftest import Driver


def _a_holds_b_resident(new: Callable[..., Driver]) -> Driver:
    d = new()
    d.register("a", lease=5)
    d.register("b", lease=600)
    d.acquire("b")
    d.finish_switch()
    d.apply(events.Yield("b"))
    d.acquire("a")
    d.finish_switch(evict_all=False)  # co-resident: b stays on the GPUs
    assert d.state.holder == "a"
    assert set(d.state.resident) == {"a", "b"}
    return d


def test_a_lapsed_holder_is_fenced_before_a_resident_waiter_is_granted(
    new: Callable[..., Driver],
) -> None:
    d = _a_holds_b_resident(new)
    d.acquire("b")  # resident: without the lapse it would be granted at once
    assert d.state.holder == "a"
    grants = len(d.grants)
    d.advance(5)
    assert d.state.holder is None
    assert len(d.grants) == grants  # not granted before the fence
    switch = d.state.switch
    assert switch is not None
    assert switch.incoming == "b"
    assert switch.fence == ("a",)
    assert "a" in switch.evict
    assert not switch.restore
    assert actions.ReleaseState("a", force=False) not in d.log
    d.finish_switch(evict_all=False)
    assert d.state.holder == "b"
    assert d.grants[-1].epoch > d.grants[-2].epoch  # the fencing token rises
    assert d.state.fencing == ()
    assert actions.ReleaseState("a", force=False) in d.log


def test_with_no_waiter_nothing_moves_until_one_comes(new: Callable[..., Driver]) -> None:
    d = _a_holds_b_resident(new)
    out = d.advance(5)
    assert not [x for x in out if isinstance(x, actions.StartSwitch)]
    assert d.state.fencing == ("a",)
    assert d.state.switch is None
    d.acquire("b")
    assert d.state.switch is not None
    assert d.state.switch.fence == ("a",)
    assert d.state.holder is None


def test_a_failed_fence_grants_nobody_and_stays_pending(new: Callable[..., Driver]) -> None:
    d = _a_holds_b_resident(new)
    d.acquire("b")
    d.advance(5)
    grants = len(d.grants)
    for _ in range(2):  # the first attempt and its retry
        switch = d.state.switch
        assert switch is not None
        assert switch.fence == ("a",)
        d.apply(events.SnapshotFailed(switch.epoch, "node n2: UNAVAILABLE", AbortedError))
    assert len(d.grants) == grants
    assert d.fails[-1].job == "b"
    assert "n2" in d.fails[-1].reason
    assert d.state.fencing == ("a",)
    assert actions.ReleaseState("a", force=False) not in d.log
    d.acquire("b")  # the next acquire fences again
    assert d.state.switch is not None
    assert d.state.switch.fence == ("a",)


def test_a_restore_failure_after_the_fence_still_counts_it(new: Callable[..., Driver]) -> None:
    d = new()
    d.register("a", lease=5)
    d.register("b", lease=600)
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    d.advance(5)
    switch = d.state.switch
    assert switch is not None
    d.apply(events.RestoreFailed(switch.epoch, "restore failed", switch.evict))
    assert d.state.fencing == ()
    assert actions.ReleaseState("a", force=False) in d.log
    retry = d.state.switch
    assert retry is not None
    assert retry.fence == ()


def test_the_lapsed_holder_back_under_its_name_is_not_fenced_against_itself(
    new: Callable[..., Driver],
) -> None:
    d = _a_holds_b_resident(new)
    d.advance(5)
    d.register("a", lease=5)
    d.acquire("a")
    switch = d.state.switch
    assert switch is not None
    assert switch.incoming == "a"
    assert switch.fence == ()
    assert d.state.fencing == ()
    d.finish_switch(evict_all=False)
    assert d.state.holder == "a"
    assert actions.ReleaseState("a", force=False) not in d.log


def test_a_pending_fence_survives_the_store(new: Callable[..., Driver]) -> None:
    d = _a_holds_b_resident(new)
    d.acquire("b")
    d.advance(5)
    again = decode_group(encode_group(d.state))
    assert again == d.state
    assert again.fencing == ("a",)
    assert again.switch is not None
    assert again.switch.fence == ("a",)
