"""One placement map (job -> resident / parked / faulted) behind the state's three views.

Cases: any views given to `place` (hypothesis: jobs named in several views, or twice in
one) give disjoint views, each job in the last place named, resident in LRU order; each
operation (`with_resident`, `park`, `fault`) moves its jobs out of the other places and
keeps every other job in order; equal views make equal states, however they were reached;
`without` places a job nowhere; a state's location of a job reads the map.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState, Location
from rlslice.scheduler.core.placement import place

job = st.sampled_from("abcdef")
names = st.lists(job, max_size=8)
reasons = st.text("xy", max_size=2)
faults = st.dictionaries(job, reasons)
SPEC = GroupSpec(name="g")


@given(names, names, faults)
def test_any_views_give_disjoint_views_each_job_in_its_last_place(
    resident: list[str], parked: list[str], faulted: dict[str, str]
) -> None:
    m = place(resident, parked, faulted)
    placed = [*m.resident, *m.parked, *m.faulted]
    assert len(placed) == len(set(placed)), "a job in two places"
    assert set(m.faulted) == set(faulted)
    assert set(m.parked) == set(parked) - set(faulted)
    assert set(m.resident) == set(resident) - set(parked) - set(faulted)
    last = {job: i for i, job in enumerate(resident)}  # a job touched twice: its last touch
    assert list(m.resident) == sorted(m.resident, key=last.__getitem__)


@given(names, names, faults, job, st.lists(job, unique=True), reasons)
def test_each_operation_moves_its_jobs_and_keeps_every_other_in_order(
    resident: list[str],
    parked: list[str],
    faulted: dict[str, str],
    one: str,
    some: list[str],
    reason: str,
) -> None:
    m = place(resident, parked, faulted)

    def others(view: tuple[str, ...], gone: set[str]) -> tuple[str, ...]:
        return tuple(j for j in view if j not in gone)

    def other_faults(gone: set[str]) -> list[tuple[str, str]]:
        return [(j, r) for j, r in m.faulted.items() if j not in gone]

    r = m.with_resident(one)
    assert r.resident == (*others(m.resident, {one}), one)
    assert r.parked == others(m.parked, {one})
    assert list(r.faulted.items()) == other_faults({one})

    f = m.fault(one, reason)
    assert f.resident == others(m.resident, {one})
    assert f.parked == others(m.parked, {one})
    assert list(f.faulted.items()) == list({**m.faulted, one: reason}.items())

    moved = [j for j in some if j not in m.parked]
    p = m.park(some)
    assert p.parked == (*m.parked, *moved)
    assert p.resident == others(m.resident, set(moved))
    assert list(p.faulted.items()) == other_faults(set(moved))


def test_equal_views_make_equal_states_however_reached() -> None:
    direct = GroupState(spec=SPEC, placement=place(("a", "b"), ("c",)))
    moved = place(("c", "b", "a"), faulted={"x": "r"}).park(["c"]).without("x")
    reached = GroupState(spec=SPEC, placement=moved.with_resident("b"))
    assert reached == direct
    # LRU order is part of the state
    assert GroupState(spec=SPEC, placement=moved) != direct


def test_without_places_a_job_nowhere_and_location_reads_the_map() -> None:
    m = place(("a", "b"), ("c",), {"d": "oom"})
    assert m.without("b").resident == ("a",)
    assert m.without("zz") is m
    s = GroupState(spec=SPEC, holder="a", placement=m)
    assert [s.location(j) for j in "abcdz"] == [
        Location.HOLDING,
        Location.RESIDENT,
        Location.PARKED,
        Location.FAULTED,
        Location.IDLE,
    ]
