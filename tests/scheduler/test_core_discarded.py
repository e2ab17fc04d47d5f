"""The parts a partial snapshot discarded reach the job in its next grant (pure core).

What a plan did with each evicted job's parts (`settle.parts_parked`):

| plan | parts |
|---|---|
| a job partly moved on one node | its offloaded and discarded tags, not whole |
| partly moved on two nodes | the tags of both, each once, in move order |
| partly moved on n1, whole on n2 | the tags of n1, whole |
| moved whole everywhere, or found parked already | no entry |

And what the core does with them:

| event | job record | next grant |
|---|---|---|
| SwitchDone parks `a` partly (discards kv_cache) | discarded (kv_cache), parked_parts (optimizer) | `discarded` names kv_cache; the record is cleared |
| SwitchDone parks `a` whole | nothing recorded | `discarded` empty |
| a serial restore fails with the evictions standing | discarded recorded all the same | - |

The grant that told them keeps them (`told_discarded`) for as long as that hold lasts, in
case its answer never reached the job:

| after the grant that told kv_cache | a holds | a's discarded, told | a's JobStatus shows | a's next grant tells |
|---|---|---|---|---|
| nothing yet | yes | (), (kv_cache) | kv_cache | nothing |
| LostGrant (its caller went away) | no | (kv_cache), () | kv_cache | kv_cache again |
| Yield | no | (), () | nothing | nothing |
| Acquire again (ALREADY_EXISTS), then a late LostGrant | yes | (), (kv_cache) | kv_cache | nothing |
| a LostGrant of an older epoch | yes | (), (kv_cache) | kv_cache | nothing |

A stored job record written before these fields decodes with them empty.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlslice._errors import AlreadyExistsError
from rlslice.scheduler._proto import group_status
from rlslice.scheduler.core import Location
from rlslice.scheduler.core.events import LostGrant, PartsParked, RestoreFailed, SwitchDone, Yield
from rlslice.scheduler.core.moves import MovePlan, NodeMoves
from rlslice.scheduler.core.parts import PartPlan
from rlslice.scheduler.core.settle import parts_parked
from rlslice.scheduler.store.codec import decode_group, encode_group

from .conftest import Driver


def _plan(discard: tuple[str, ...], offload: tuple[str, ...]) -> PartPlan:
    return PartPlan(discard, offload, ("weights",), 10, 20, fits=True)


_KV = _plan(("kv_cache",), ("optimizer",))
_GRAPHS = _plan(("graphs",), ("optimizer", "adapters"))


@pytest.mark.parametrize(
    ("nodes", "evict", "want"),
    [
        (
            (NodeMoves("n1", ("a",), "b", {"a": _KV}),),
            ("a",),
            {"a": PartsParked(("optimizer",), ("kv_cache",))},
        ),
        (
            (
                NodeMoves("n1", ("a",), "b", {"a": _KV}),
                NodeMoves("n2", ("a",), "b", {"a": _GRAPHS}),
            ),
            ("a",),
            {"a": PartsParked(("optimizer", "adapters"), ("kv_cache", "graphs"))},
        ),
        (
            (NodeMoves("n1", ("a",), "b", {"a": _KV}), NodeMoves("n2", ("a",), "b")),
            ("a",),
            {"a": PartsParked(("optimizer",), ("kv_cache",), whole=True)},
        ),
        ((NodeMoves("n1", ("a",), "b"),), ("a", "c"), {}),
    ],
    ids=["one-node", "two-nodes", "partial-and-whole", "whole-or-already-parked"],
)
def test_a_plan_says_which_parts_of_each_evicted_job_it_moved(
    nodes: tuple[NodeMoves, ...], evict: tuple[str, ...], want: dict[str, PartsParked]
) -> None:
    assert parts_parked(MovePlan(evict, nodes)) == want


def _a_holding_b_waiting(new: Callable[..., Driver]) -> Driver:
    d = new()
    for job in ("a", "b"):
        d.register(job)
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    d.apply(Yield("a"))
    assert d.state.switch is not None
    assert d.state.switch.incoming == "b"
    return d


def _park_a(d: Driver, parts: dict[str, PartsParked]) -> None:
    """Finish the switch to b that parks a with `parts`, then let b yield to a."""
    switch = d.state.switch
    assert switch is not None
    d.apply(SwitchDone(switch.epoch, ("a",), moved_bytes=10, parts=parts))
    assert d.state.holder == "b"
    assert d.state.location("a") is Location.PARKED


def _grant_a_again(d: Driver) -> None:
    d.acquire("a")
    d.apply(Yield("b"))
    d.finish_switch()
    assert d.state.holder == "a"


def test_a_partly_parked_job_is_told_its_discarded_parts_in_its_next_grant(
    new: Callable[..., Driver],
) -> None:
    d = _a_holding_b_waiting(new)
    _park_a(d, {"a": PartsParked(("optimizer",), ("kv_cache",))})
    record = d.state.jobs["a"]
    assert record.discarded == ("kv_cache",)
    assert record.parked_parts == ("optimizer",)
    assert d.grants[-1].job == "b"
    assert d.grants[-1].discarded == ()
    _grant_a_again(d)
    assert d.grants[-1].job == "a"
    assert d.grants[-1].discarded == ("kv_cache",)
    record = d.state.jobs["a"]
    assert (record.discarded, record.parked_parts) == ((), ())


def test_a_job_parked_whole_is_told_nothing_was_discarded(new: Callable[..., Driver]) -> None:
    d = _a_holding_b_waiting(new)
    _park_a(d, {})
    assert (d.state.jobs["a"].discarded, d.state.jobs["a"].parked_parts) == ((), ())
    _grant_a_again(d)
    assert d.grants[-1].job == "a"
    assert d.grants[-1].discarded == ()


def test_a_failed_serial_restore_still_records_the_discarded_parts(
    new: Callable[..., Driver],
) -> None:
    d = _a_holding_b_waiting(new)
    switch = d.state.switch
    assert switch is not None
    d.apply(
        RestoreFailed(
            switch.epoch, "n1: restore refused", ("a",), 10, {"a": PartsParked((), ("kv_cache",))}
        )
    )
    assert d.state.location("a") is Location.PARKED
    assert d.state.jobs["a"].discarded == ("kv_cache",)


def test_a_stored_job_record_without_the_parts_fields_decodes_with_them_empty(
    new: Callable[..., Driver],
) -> None:
    d = _a_holding_b_waiting(new)
    _park_a(d, {"a": PartsParked(("optimizer",), ("kv_cache",))})
    stored = encode_group(d.state)
    assert stored["jobs"][0]["discarded"] == ["kv_cache"]
    for job in stored["jobs"]:
        del job["discarded"], job["parked_parts"], job["told_discarded"]
    decoded = decode_group(stored)
    assert decoded.jobs["a"].discarded == ()
    assert decoded.jobs["a"].parked_parts == ()
    assert decoded.jobs["a"].told_discarded == ()
    assert decode_group(encode_group(d.state)).jobs["a"].discarded == ("kv_cache",)


def _a_told_kv_cache(new: Callable[..., Driver]) -> Driver:
    """a, partly parked with kv_cache discarded, holds again by a grant that told it so."""
    d = _a_holding_b_waiting(new)
    _park_a(d, {"a": PartsParked(("optimizer",), ("kv_cache",))})
    _grant_a_again(d)
    assert (d.grants[-1].job, d.grants[-1].discarded) == ("a", ("kv_cache",))
    return d


def _shown(d: Driver, job: str) -> tuple[str, ...]:
    """`JobStatus.discarded_parts` of `job` in the group's GetGroup answer."""
    status = group_status(d.state, now=d.now, busy=0.0, nodes=())
    return next(tuple(j.discarded_parts) for j in status.jobs if j.job == job)


def _lose_the_grant(d: Driver) -> None:
    d.apply(LostGrant("a", d.grants[-1].epoch))


def _yield(d: Driver) -> None:
    d.apply(Yield("a"))


def _acquire_again_then_lose_the_grant(d: Driver) -> None:
    d.acquire("a")
    assert (d.fails[-1].job, d.fails[-1].kind) == ("a", AlreadyExistsError)
    _lose_the_grant(d)


def _lose_an_older_grant(d: Driver) -> None:
    d.apply(LostGrant("a", d.grants[-1].epoch - 1))


@pytest.mark.parametrize(
    ("after", "holds", "record", "shown", "next_grant"),
    [
        (lambda d: None, True, ((), ("kv_cache",)), ("kv_cache",), ()),
        (_lose_the_grant, False, (("kv_cache",), ()), ("kv_cache",), ("kv_cache",)),
        (_yield, False, ((), ()), (), ()),
        (_acquire_again_then_lose_the_grant, True, ((), ("kv_cache",)), ("kv_cache",), ()),
        (_lose_an_older_grant, True, ((), ("kv_cache",)), ("kv_cache",), ()),
    ],
    ids=["holding", "lost-grant", "yield", "answered-then-late-lost-grant", "older-lost-grant"],
)
def test_the_discarded_parts_a_grant_told_are_kept_until_its_hold_ends(
    new: Callable[..., Driver],
    after: Callable[[Driver], None],
    holds: bool,
    record: tuple[tuple[str, ...], tuple[str, ...]],
    shown: tuple[str, ...],
    next_grant: tuple[str, ...],
) -> None:
    d = _a_told_kv_cache(new)
    after(d)
    assert (d.state.holder == "a") is holds
    job = d.state.jobs["a"]
    assert (job.discarded, job.told_discarded) == record
    assert _shown(d, "a") == shown
    assert decode_group(encode_group(d.state)).jobs["a"] == job
    if holds:
        _yield(d)
        assert d.state.jobs["a"].told_discarded == ()
    grants = len(d.grants)
    d.acquire("a")
    assert len(d.grants) == grants + 1
    assert (d.grants[-1].job, d.grants[-1].discarded) == ("a", next_grant)


def test_a_job_that_is_not_holding_shows_only_the_parts_its_next_grant_will_tell(
    new: Callable[..., Driver],
) -> None:
    d = _a_holding_b_waiting(new)
    _park_a(d, {"a": PartsParked(("optimizer",), ("kv_cache",))})
    assert _shown(d, "a") == ("kv_cache",)
    assert _shown(d, "b") == ()
    assert d.state.jobs["b"].told_discarded == ()
