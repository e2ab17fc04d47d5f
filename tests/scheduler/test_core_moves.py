"""Move planning over plain per-node reports (`core.moves`), as tables.

plan_switch cases: fits beside -> no eviction, only the restore; short -> LRU eviction and
its snapshots on the nodes that hold the job; a silent node -> every candidate evicted, the
silent node called for each snapshot and for the restore of a parked job; unknown size ->
every candidate; a job parked already (a resumed switch) counts as evicted; a job running on
one node only is snapshotted there only.
plan_prefetch cases: fits -> restore only; the holder is never evicted; another resident is,
when that makes room; no room even then -> None; silent node -> None; nothing parked -> None,
unless it runs already (a resumed prefetch): an empty plan; what the holder declared but has
not allocated yet counts as taken.
plan_park: snapshots where the job is not parked.
"""

from __future__ import annotations

import pytest

from rlslice.scheduler.core.moves import (
    JobReport,
    Need,
    NodeMoves,
    NodeReport,
    Place,
    evicts_every_candidate,
    on_devices,
    plan_park,
    plan_prefetch,
    plan_switch,
)

G = 1 << 30
R, P = Place.RUNNING, Place.PARKED


def node(name: str, free: int, **jobs: tuple[Place, int]) -> NodeReport:
    reports = {
        job: JobReport(place, size if place is R else 0, size if place is not R else 0)
        for job, (place, size) in jobs.items()
    }
    return NodeReport(name, True, (free,), reports)


SILENT = NodeReport("n9", answered=False)


@pytest.mark.parametrize(
    ("reports", "candidates", "must", "evict", "moves"),
    [
        # b (4 G parked) fits beside a: nothing evicted, only the restore
        ([node("n1", 6 * G, a=(R, 4 * G), b=(P, 4 * G))], ["a"], [], (), [("n1", (), "b")]),
        # short: a goes, snapshot and restore on the same node
        ([node("n1", 2 * G, a=(R, 4 * G), b=(P, 4 * G))], ["a"], [], ("a",), [("n1", ("a",), "b")]),
        # a must go (preempted) although b fits
        (
            [node("n1", 9 * G, a=(R, 4 * G), b=(P, 4 * G))],
            ["c"],
            ["a"],
            ("a",),
            [("n1", ("a",), "b")],
        ),
        # a silent node: every candidate, called there for each move
        (
            [node("n1", 9 * G, a=(R, 4 * G), b=(P, 4 * G)), SILENT],
            ["a"],
            [],
            ("a",),
            [("n1", ("a",), "b"), ("n9", ("a",), "b")],
        ),
        # a parked already (a resumed switch): counted as evicted, no second snapshot
        ([node("n1", 9 * G, a=(P, 4 * G), b=(P, 4 * G))], ["a"], [], ("a",), [("n1", (), "b")]),
        # a job on one node only is moved there only
        (
            [node("n1", 2 * G, a=(R, 4 * G), b=(P, 4 * G)), node("n2", 2 * G, b=(P, 4 * G))],
            ["a"],
            [],
            ("a",),
            [("n1", ("a",), "b"), ("n2", (), "b")],
        ),
    ],
)
def test_plan_switch(
    reports: list[NodeReport],
    candidates: list[str],
    must: list[str],
    evict: tuple[str, ...],
    moves: list[tuple[str, tuple[str, ...], str | None]],
) -> None:
    plan = plan_switch(Need("b"), reports, candidates, must_evict=must)
    assert plan.evict == evict
    assert plan.nodes == tuple(NodeMoves(n, s, r) for n, s, r in moves)


def test_an_unknown_size_evicts_every_candidate() -> None:
    reports = [node("n1", 9 * G, a=(R, 1 * G), c=(R, 1 * G))]  # b unknown here, undeclared
    assert plan_switch(Need("b"), reports, ["a", "c"]).evict == ("a", "c")
    declared = plan_switch(Need("b", declared_bytes=G), reports, ["a", "c"])
    assert declared.evict == ()


@pytest.mark.parametrize(
    ("reports", "residents", "expected"),
    [
        # fits beside the holder a: restore only
        ([node("n1", 6 * G, a=(R, 4 * G), b=(P, 4 * G))], ["a"], ((), [("n1", (), "b")])),
        # no room beside the holder: None (the holder is never evicted for a prefetch)
        ([node("n1", 2 * G, a=(R, 4 * G), b=(P, 4 * G))], ["a"], None),
        # another resident c makes room: evicted, never a
        (
            [node("n1", 2 * G, a=(R, 4 * G), b=(P, 4 * G), c=(R, 3 * G))],
            ["c", "a"],
            (("c",), [("n1", ("c",), "b")]),
        ),
        # even evicting c leaves no room: None
        ([node("n1", 0, a=(R, 8 * G), b=(P, 4 * G), c=(R, 1 * G))], ["c", "a"], None),
        # a silent node: never blind
        ([node("n1", 9 * G, a=(R, 4 * G), b=(P, 4 * G)), SILENT], ["a"], None),
        # nothing parked and not running: nothing to do
        ([node("n1", 9 * G, a=(R, 4 * G))], ["a"], None),
        # running already (a resumed prefetch that had finished): an empty plan
        ([node("n1", 9 * G, a=(R, 4 * G), b=(R, 4 * G))], ["a"], ((), [])),
    ],
)
def test_plan_prefetch(
    reports: list[NodeReport],
    residents: list[str],
    expected: tuple[tuple[str, ...], list[tuple[str, tuple[str, ...], str]]] | None,
) -> None:
    plan = plan_prefetch(Need("b"), reports, residents, holder="a")
    if expected is None:
        assert plan is None
        return
    assert plan is not None
    evict, moves = expected
    assert plan.evict == evict
    assert plan.nodes == tuple(NodeMoves(n, s, r) for n, s, r in moves)


def test_what_the_holder_declared_but_has_not_allocated_keeps_a_prefetch_out() -> None:
    # The holder a was granted before it allocated (0 of its 6 GiB on the device): b's
    # 4 GiB must not come back beside it (found by the Slurm example: a's load then ran out
    # of emulated memory).
    early = [node("n1", 8 * G, a=(R, 0), b=(P, 4 * G))]
    assert plan_prefetch(Need("b"), early, ["a"], holder="a", holder_declared_bytes=6 * G) is None
    assert plan_prefetch(Need("b"), early, ["a"], holder="a") is not None
    allocated = [node("n1", 2 * G, a=(R, 6 * G), b=(P, 2 * G))]
    plan = plan_prefetch(Need("b"), allocated, ["a"], holder="a", holder_declared_bytes=6 * G)
    assert plan is not None
    assert plan.nodes == (NodeMoves("n1", (), "b"),)


def test_headroom_keeps_a_prefetch_out() -> None:
    reports = [node("n1", 6 * G, a=(R, 4 * G), b=(P, 4 * G))]
    assert plan_prefetch(Need("b"), reports, ["a"], holder="a", headroom_bytes=G) is not None
    assert plan_prefetch(Need("b"), reports, ["a"], holder="a", headroom_bytes=3 * G) is None


@pytest.mark.parametrize(
    ("reports", "candidates", "headroom", "everyone"),
    [
        # b fits beside a: a may stay
        ([node("n1", 6 * G, a=(R, 4 * G), b=(P, 4 * G))], ["a"], 0, False),
        # no room beside a: a goes, whatever the numbers are by the switch
        ([node("n1", 2 * G, a=(R, 4 * G), b=(P, 4 * G))], ["a"], 0, True),
        # the headroom leaves no room beside a
        ([node("n1", 6 * G, a=(R, 4 * G), b=(P, 4 * G))], ["a"], 3 * G, True),
        # evicting c (least recently used) makes room: a may stay
        ([node("n1", 2 * G, a=(R, 4 * G), b=(P, 4 * G), c=(R, 3 * G))], ["c", "a"], 0, False),
        # short on one node of two: every candidate goes
        (
            [
                node("n1", 9 * G, a=(R, 4 * G), b=(P, 4 * G)),
                node("n2", G, a=(R, 4 * G), b=(P, 4 * G)),
            ],
            ["a"],
            0,
            True,
        ),
        # a silent node: unknown, so not known to evict everyone
        ([node("n1", 2 * G, a=(R, 4 * G), b=(P, 4 * G)), SILENT], ["a"], 0, False),
        # nothing to evict: nothing to know
        ([node("n1", 2 * G, b=(P, 4 * G))], [], 0, False),
    ],
)
def test_evicts_every_candidate(
    reports: list[NodeReport], candidates: list[str], headroom: int, everyone: bool
) -> None:
    found = evicts_every_candidate(Need("b"), reports, candidates, headroom_bytes=headroom)
    assert found is everyone
    if everyone:  # what plan_switch makes of the same reports
        assert set(
            plan_switch(Need("b"), reports, candidates, headroom_bytes=headroom).evict
        ) == set(candidates)


def test_an_unknown_size_is_not_known_to_evict_every_candidate() -> None:
    reports = [node("n1", 0, a=(R, 4 * G))]  # b unknown on n1 and undeclared
    assert not evicts_every_candidate(Need("b"), reports, ["a"])
    assert evicts_every_candidate(Need("b", declared_bytes=G), reports, ["a"])


def test_on_devices_names_the_jobs_some_node_holds_on_its_devices() -> None:
    reports = [
        node("n1", 0, a=(R, G), b=(P, G), c=(P, G)),
        node("n2", 0, a=(P, G), b=(P, G), d=(R, G)),
    ]
    # a runs on n1, d on n2; b and c are parked wherever known; e is known nowhere
    assert on_devices(reports, ["a", "b", "c", "d", "e"]) == {"a", "d"}
    # a silent node may hold any of them: none is known to be off the devices
    assert on_devices([*reports, SILENT], ["b", "e"]) == {"b", "e"}


def test_plan_park_snapshots_where_the_job_is_not_parked() -> None:
    reports = [node("n1", 0, b=(R, G)), node("n2", 0, b=(P, G)), node("n3", 0)]
    plan = plan_park("b", reports)
    assert plan.evict == ("b",)
    assert plan.nodes == (NodeMoves("n1", ("b",), None),)
