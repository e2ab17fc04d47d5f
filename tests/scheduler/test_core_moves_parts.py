"""Partial moves in the switch planner (`core.moves.plan_switch` with `parts`), as tables.

Cases: a job that declared parts and whose parts make room moves only those (a partial fit:
the discard first, then the part needed last); the incoming job fits beside it already ->
nothing moves, no partial plan; a part larger than what the incoming job lacks moves in
full (parts are never split); a part larger than the host memory free is skipped for the
next one; parts that cannot make room -> the job moves whole; a job that declared nothing,
or one that must go, moves whole; a silent node -> whole; two outgoing jobs -> the first
moves whole when its parts are not enough, the second only what is still lacking; an
incoming job parked partly needs room for its discarded parts as well as its parked ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from rlslice.config import MoveClass, StatePart
from rlslice.scheduler.core.moves import (
    JobReport,
    MovePlan,
    Need,
    NodeReport,
    Place,
    plan_switch,
)

G = 1 << 30
R, P = Place.RUNNING, Place.PARKED
DIS, OFF = MoveClass.DISCARD, MoveClass.OFFLOAD

A_PARTS = (
    StatePart(tag="weights", bytes=4 * G),
    StatePart(tag="optimizer", bytes=2 * G, need_order=2),
    StatePart(tag="kv_cache", bytes=1 * G, move_class=DIS),
    StatePart(tag="adapters", bytes=1 * G, need_order=1),
)


def node(
    free: int, host: int | None = None, name: str = "n1", **jobs: tuple[Place, int]
) -> NodeReport:
    reports = {
        job: JobReport(place, size if place is R else 0, size if place is not R else 0)
        for job, (place, size) in jobs.items()
    }
    return NodeReport(name, True, (free,), reports, host)


def switch(
    reports: Sequence[NodeReport],
    candidates: Sequence[str] = ("a",),
    parts: Mapping[str, Sequence[StatePart]] | None = None,
    must: Sequence[str] = (),
) -> MovePlan:
    return plan_switch(
        Need("b"),
        reports,
        candidates,
        must_evict=must,
        parts={"a": A_PARTS} if parts is None else parts,
    )


def tags(plan: MovePlan, job: str = "a") -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    (moves,) = plan.nodes
    found = moves.partial.get(job)
    return None if found is None else (found.discard, found.offload)


@pytest.mark.parametrize(
    ("free", "b_bytes", "host", "expected"),
    [
        # b lacks 2 G: the kv_cache is discarded, then the part needed last (optimizer)
        (1 * G, 3 * G, None, (("kv_cache",), ("optimizer",))),
        # b lacks 1 G: discarding the kv_cache is enough, nothing is copied
        (1 * G, 2 * G, None, (("kv_cache",), ())),
        # b lacks 2.5 G: after the kv_cache, the 2 G optimizer moves in full (never split)
        (1 * G, int(3.5 * G), None, (("kv_cache",), ("optimizer",))),
        # the optimizer is larger than the host memory free: the adapters go instead
        (1 * G, 3 * G, 1 * G, (("kv_cache",), ("adapters",))),
    ],
)
def test_a_job_that_declared_parts_moves_only_the_parts_the_incoming_job_needs(
    free: int, b_bytes: int, host: int | None, expected: tuple[tuple[str, ...], ...]
) -> None:
    plan = switch([node(free, host, a=(R, 8 * G), b=(P, b_bytes))])
    assert plan.evict == ("a",)
    assert plan.nodes[0].snapshot == ("a",)
    assert plan.nodes[0].restore == "b"
    assert tags(plan) == expected


def test_a_partial_plan_frees_what_the_incoming_job_lacks_and_copies_only_offloads() -> None:
    plan = switch([node(1 * G, a=(R, 8 * G), b=(P, 3 * G))])
    found = plan.nodes[0].partial["a"]
    assert (found.bytes_freed, found.bytes_copied, found.fits) == (3 * G, 2 * G, True)
    assert found.keep == ("weights", "adapters")


def test_nothing_moves_when_the_incoming_job_fits_beside() -> None:
    plan = switch([node(4 * G, a=(R, 8 * G), b=(P, 3 * G))])
    assert plan.evict == ()
    assert [(m.snapshot, m.restore, dict(m.partial)) for m in plan.nodes] == [((), "b", {})]


def test_a_job_whose_parts_cannot_make_room_moves_whole() -> None:
    # b needs 10 G, 3 G free: a's 6 G of parts are not enough, so a moves whole (and the
    # switch is refused further on, as today, when it still does not fit)
    plan = switch([node(3 * G, a=(R, 8 * G), b=(P, 10 * G))], parts={"a": A_PARTS[:2]})
    assert plan.evict == ("a",)
    assert tags(plan) is None


def test_a_job_that_declared_nothing_moves_whole() -> None:
    for parts in ({}, {"a": ()}):
        plan = switch([node(1 * G, a=(R, 8 * G), b=(P, 3 * G))], parts=parts)
        assert plan.nodes[0].snapshot == ("a",)
        assert tags(plan) is None


def test_a_job_that_must_go_moves_whole_although_it_declared_parts() -> None:
    plan = switch([node(9 * G, a=(R, 8 * G), b=(P, 3 * G))], candidates=(), must=("a",))
    assert plan.evict == ("a",)
    assert tags(plan) is None


def test_a_silent_node_moves_every_candidate_whole() -> None:
    silent = NodeReport("n9", answered=False)
    plan = switch([node(1 * G, a=(R, 8 * G), b=(P, 3 * G)), silent])
    assert plan.evict == ("a",)
    assert all(not m.partial for m in plan.nodes)


def test_a_second_outgoing_job_moves_only_what_the_first_did_not_free() -> None:
    # c (LRU first, 2 G, no parts) moves whole; b lacks 3 G in all, so a frees 1 G more
    reports = [node(1 * G, a=(R, 8 * G), c=(R, 2 * G), b=(P, 4 * G))]
    plan = switch(reports, candidates=("c", "a"))
    assert plan.evict == ("c", "a")
    assert plan.nodes[0].snapshot == ("c", "a")
    assert tags(plan, "c") is None
    assert tags(plan) == (("kv_cache",), ())


def test_an_incoming_job_parked_partly_needs_room_for_what_it_discarded_too() -> None:
    # a parked its 2 G optimizer and discarded its 1 G kv_cache (it rebuilds it once back):
    # with 1 G free it lacks 2 G, not the 1 G its 2 G of host bytes alone would say
    b_parts = (StatePart(tag="x", bytes=1 * G), StatePart(tag="y", bytes=3 * G))
    a = JobReport(P, host_bytes=2 * G)
    reports = [NodeReport("n1", True, (1 * G,), {"a": a, "b": JobReport(R, 4 * G)})]
    plan = plan_switch(Need("a", discard_bytes=1 * G), reports, ("b",), parts={"b": b_parts})
    assert plan.evict == ("b",)
    assert plan.nodes[0].partial["b"].offload == ("x", "y")
    unaware = plan_switch(Need("a"), reports, ("b",), parts={"b": b_parts})
    assert unaware.nodes[0].partial["b"].offload == ("x",)
