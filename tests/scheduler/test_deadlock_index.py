"""The engine's wait index across groups (`scheduler.core.waits`), fed with group states.

Cases: whom a group's waiters wait on (the holder; the job a switch brings in while its
caller waits or was detached by a restart; nobody when that caller left); `update` reports a
new holder only when it changed to a job; attached waiters count, detached ones do not;
a dropped group leaves nothing behind; the cycle check finds a two-group cycle and does not
search for a job that holds nothing; the index follows hypothesis-chosen sequences of
states exactly as an index rebuilt from scratch would.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState, Switch, Waiter
from rlslice.scheduler.core.waits import WaitIndex, graph_holder


def _state(
    name: str,
    holder: str | None = None,
    waiters: tuple[str, ...] = (),
    *,
    detached: tuple[str, ...] = (),
    switch: Switch | None = None,
) -> GroupState:
    queue = tuple(Waiter(j, i, 0.0) for i, j in enumerate(waiters, 1)) + tuple(
        Waiter(j, 100 + i, 0.0, attached=False) for i, j in enumerate(detached)
    )
    return GroupState(spec=GroupSpec(name=name), holder=holder, queue=queue, switch=switch)


def _switch(incoming: str, ticket: int | None, detached: bool = False) -> Switch:
    return Switch(incoming, ticket, 0.0, (), (), False, 1, 2, 1, 0.0, detached=detached)


def test_waiters_wait_on_the_holder_or_the_job_a_switch_brings_in() -> None:
    assert graph_holder(_state("g", "a")) == "a"
    assert graph_holder(_state("g", switch=_switch("b", 7))) == "b"
    assert graph_holder(_state("g", switch=_switch("b", None, detached=True))) == "b"
    assert graph_holder(_state("g", switch=_switch("b", None))) is None  # its caller left
    assert graph_holder(_state("g")) is None


def test_update_reports_a_new_holder_only_when_it_changed_to_a_job() -> None:
    index = WaitIndex()
    free = _state("g1", waiters=("b",))
    held = _state("g1", "a", ("b",))
    assert index.update(None, free) is False
    assert index.update(free, held) is True
    assert index.update(held, replace(held, epoch=3)) is False
    assert index.update(held, free) is False
    assert index.holders == {}
    assert index.held == {}
    assert index.waiting == {"b": {"g1"}}


def test_only_attached_waiters_wait() -> None:
    index = WaitIndex()
    index.update(None, _state("g1", "a", ("b",), detached=("c",)))
    assert index.waits("b", "g1")
    assert not index.waits("c", "g1")


def test_a_dropped_group_leaves_nothing_behind() -> None:
    index = WaitIndex()
    state = _state("g1", "a", ("b", "c"))
    index.update(None, state)
    index.update(state, None)
    assert (index.holders, index.held, index.waiting) == ({}, {}, {})


def test_the_cycle_check_finds_two_groups_and_skips_a_job_holding_nothing() -> None:
    index = WaitIndex()
    index.update(None, _state("g1", "a", ("b",)))
    index.update(None, _state("g2", "b", ("a", "c")))
    found = index.cycle("a", "g2")
    assert found is not None
    assert found.jobs == ("a", "b")
    assert index.cycle("c", "g2") is None  # c holds nothing


JOBS = ["a", "b", "c"]
states = st.builds(
    lambda holder, waiters, detached: _state(
        "g",
        holder,
        tuple(j for j in waiters if j != holder),
        detached=tuple(j for j in detached if j != holder and j not in waiters),
    ),
    st.none() | st.sampled_from(JOBS),
    st.lists(st.sampled_from(JOBS), unique=True, max_size=3),
    st.lists(st.sampled_from(JOBS), unique=True, max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["g1", "g2"]), states | st.none()), max_size=12))
def test_the_index_matches_one_rebuilt_from_the_current_states(
    steps: list[tuple[str, GroupState | None]],
) -> None:
    index = WaitIndex()
    current: dict[str, GroupState] = {}
    for name, state in steps:
        after = replace(state, spec=GroupSpec(name=name)) if state is not None else None
        index.update(current.get(name), after)
        if after is None:
            current.pop(name, None)
        else:
            current[name] = after
    fresh = WaitIndex()
    for state in current.values():
        fresh.update(None, state)
    assert (index.holders, index.held, index.waiting) == (
        fresh.holders,
        fresh.held,
        fresh.waiting,
    )
