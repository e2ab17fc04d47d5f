"""One placement map (job -> resident / parked / faulted) behind the state's three views.

Cases: any views given to `GroupState` (hypothesis: jobs named in several views, or twice
in one) give disjoint views, each job in the last place named, resident in LRU order;
replacing one view moves its jobs out of the others and keeps the rest in order; equal
views make equal states, however they were reached; `without` places a job nowhere; a
state's location of a job reads the map.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState, Location
from rlslice.scheduler.core.placement import place

names = st.lists(st.sampled_from("abcdef"), max_size=8)
SPEC = GroupSpec(name="g")


@given(names, names, st.dictionaries(st.sampled_from("abcdef"), st.text("xy", max_size=2)))
def test_any_views_give_disjoint_views_each_job_in_its_last_place(
    resident: list[str], parked: list[str], faulted: dict[str, str]
) -> None:
    s = GroupState(spec=SPEC, resident=resident, parked=parked, faulted=faulted)
    placed = [*s.resident, *s.parked, *s.faulted]
    assert len(placed) == len(set(placed)), "a job in two places"
    assert set(s.faulted) == set(faulted)
    assert set(s.parked) == set(parked) - set(faulted)
    assert set(s.resident) == set(resident) - set(parked) - set(faulted)
    last = {job: i for i, job in enumerate(resident)}  # a job touched twice: its last touch
    assert list(s.resident) == sorted(s.resident, key=last.__getitem__)


def test_replacing_one_view_moves_its_jobs_out_of_the_others() -> None:
    s = GroupState(spec=SPEC, resident=("a", "b"), parked=("c", "d"), faulted={"e": "oom"})
    t = replace(s, resident=("b", "c"))
    assert (t.resident, t.parked, dict(t.faulted)) == (("b", "c"), ("d",), {"e": "oom"})
    u = replace(t, faulted={"b": "gone"})
    assert (u.resident, u.parked, dict(u.faulted)) == (("c",), ("d",), {"b": "gone"})


def test_equal_views_make_equal_states_however_reached() -> None:
    direct = GroupState(spec=SPEC, resident=("a", "b"), parked=("c",))
    moved = replace(
        GroupState(spec=SPEC, resident=("c", "b", "a"), faulted={"x": "r"}),
        parked=("c",),
        faulted={},
    )
    moved = replace(moved, resident=("a", "b"))
    assert moved == direct
    assert replace(direct, resident=("b", "a")) != direct  # LRU order is part of the state


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
