"""The agents' disk-tier moves in the pure core: ring records for the timeline's spill lane.

Case matrix:

| event | recorded |
|---|---|
| a skipped prefetch whose agents filled the waiter from disk (and spilled another job for room) | one SPILL_DONE and one FILL_DONE record, job, node in `detail`, bytes and seconds; then the prefetch's `skipped` record; the waiter stays parked, not tried again |
| a switch done whose moves include a spill | SPILL_DONE beside SNAPSHOT_DONE / RESTORE_DONE, in the order the moves came |
| a skipped prefetch with no moves | no tier record |
"""

from __future__ import annotations

from collections.abc import Callable

from rlslice.scheduler.core import Location, actions, events
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.events import MoveKind, NodeMove

from .conftest import Driver

MiB = 1 << 20
TIER = (Kind.SPILL_DONE, Kind.FILL_DONE)


def _b_parked_a_holding(new: Callable[..., Driver]) -> Driver:
    d = new()
    for job in ("a", "b", "c"):
        d.register(job)
    d.acquire("b")
    d.finish_switch()
    d.acquire("a")
    d.apply(events.Yield("b"))
    d.finish_switch()
    assert d.state.location("b") is Location.PARKED
    d.prefetch_fits = True  # the test answers the prefetch itself
    return d


def _records(d: Driver, kinds: tuple[Kind, ...]) -> list[tuple[str, str, str, int, float]]:
    return [
        (r.kind.value, r.job, r.detail, r.bytes, r.seconds)
        for r in d.log
        if isinstance(r, actions.Record) and r.kind in kinds
    ]


def test_a_skipped_prefetch_records_the_fills_and_spills_its_agents_made(
    new: Callable[..., Driver],
) -> None:
    d = _b_parked_a_holding(new)
    d.acquire("b")
    switch = d.state.switch
    assert switch is not None
    assert switch.purpose == "prefetch"
    moves = (
        NodeMove("n1", "c", MoveKind.SPILL, 8 * MiB, 0.25),
        NodeMove("n1", "b", MoveKind.FILL, 8 * MiB, 0.5),
    )
    d.apply(events.PrefetchSkipped(switch.epoch, "does not fit beside the holder", moves))
    assert _records(d, TIER) == [
        ("spill_done", "c", "n1", 8 * MiB, 0.25),
        ("fill_done", "b", "n1", 8 * MiB, 0.5),
    ]
    prefetch = [
        r.detail for r in d.log if isinstance(r, actions.Record) and r.kind is Kind.PREFETCH
    ]
    assert prefetch[-1].startswith("skipped")
    assert d.state.location("b") is Location.PARKED
    assert d.state.switch is None
    assert d.state.unfit == ("a", "b")


def test_a_switchs_spill_is_recorded_beside_its_snapshot_and_restore(
    new: Callable[..., Driver],
) -> None:
    d = _b_parked_a_holding(new)
    d.prefetch_fits = False
    d.acquire("b")
    d.apply(events.Yield("a"))
    switch = d.state.switch
    assert switch is not None
    assert switch.incoming == "b"
    moves = (
        NodeMove("n1", "a", MoveKind.SNAPSHOT, 4 * MiB, 0.1),
        NodeMove("n1", "c", MoveKind.SPILL, 2 * MiB, 0.05),
        NodeMove("n1", "b", MoveKind.RESTORE, 4 * MiB, 0.1),
    )
    d.apply(events.SwitchDone(switch.epoch, ("a",), moved_bytes=8 * MiB, seconds=0.2, moves=moves))
    kinds = (Kind.SNAPSHOT_DONE, Kind.RESTORE_DONE, *TIER)
    assert [(k, j) for k, j, *_ in _records(d, kinds)][-3:] == [
        ("snapshot_done", "a"),
        ("spill_done", "c"),
        ("restore_done", "b"),
    ]
    assert d.state.holder == "b"


def test_a_skipped_prefetch_without_moves_records_no_tier_move(
    new: Callable[..., Driver],
) -> None:
    d = _b_parked_a_holding(new)
    d.prefetch_fits = False  # the driver skips it, with no moves
    d.acquire("b")
    assert d.state.unfit == ("a", "b")
    assert _records(d, TIER) == []
