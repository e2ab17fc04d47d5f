"""The wait-for cycle search (`scheduler.core.deadlock.closing_cycle`), pure.

Cases, as a table: the two-job cross (opposite orders), a three-job ring, a chain with no
cycle, a free group, a group held by the waiter itself, a waiter that holds nothing, a
branch where only one arm closes the cycle, the shortest of two cycles, self-waits ignored,
unrelated cycles elsewhere not reported. The message names every job and group in order.
Hypothesis: on random holders and waits, a cycle is reported exactly when the holder of the
group reaches the waiter in a brute-force transitive closure (computed differently, as
distances over all pairs), the reported cycle is a real, simple, chained cycle of the graph,
starts with the closing wait, and is a shortest one.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlslice.scheduler.core import Deadlock, WaitEdge, closing_cycle

Holders = dict[str, str]
Waiting = dict[str, set[str]]

# (name, holders, waiting, job, group, expected jobs of the cycle or None)
TABLE: list[tuple[str, Holders, Waiting, str, str, tuple[str, ...] | None]] = [
    ("two jobs in opposite orders", {"g1": "a", "g2": "b"}, {"b": {"g1"}}, "a", "g2", ("a", "b")),
    (
        "three jobs in a ring",
        {"g1": "a", "g2": "b", "g3": "c"},
        {"b": {"g3"}, "c": {"g1"}},
        "a",
        "g2",
        ("a", "b", "c"),
    ),
    (
        "a chain that ends at a running job",
        {"g1": "a", "g2": "b", "g3": "c"},
        {"b": {"g3"}},
        "a",
        "g2",
        None,
    ),
    ("a free group", {"g1": "a"}, {"b": {"g1"}}, "a", "g2", None),
    ("a group the waiter holds itself", {"g1": "a"}, {}, "a", "g1", None),
    ("a waiter that holds nothing", {"g2": "b"}, {"b": {"g1"}}, "a", "g2", None),
    (
        "only one arm of a branch comes back",
        {"g1": "a", "g2": "b", "g3": "c", "g4": "d"},
        {"b": {"g3", "g4"}, "d": {"g1"}},
        "a",
        "g2",
        ("a", "b", "d"),
    ),
    (
        "the shorter of two cycles",
        {"g1": "a", "g2": "b", "g3": "c", "g4": "d"},
        {"b": {"g3", "g1"}, "c": {"g4"}, "d": {"g1"}},
        "a",
        "g2",
        ("a", "b"),
    ),
    (
        "the shorter of two arms, not the one searched deeper first",
        {"g1": "a", "g2": "b", "g3": "c", "g4": "d", "g5": "e"},
        {"b": {"g3", "g4"}, "c": {"g1"}, "d": {"g5"}, "e": {"g1"}},
        "a",
        "g2",
        ("a", "b", "c"),
    ),
    (
        "a job waiting on a group it holds is no edge",
        {"g1": "a", "g2": "b"},
        {"b": {"g2"}},
        "a",
        "g2",
        None,
    ),
    (
        "a cycle elsewhere is not this wait's",
        {"g1": "a", "g2": "b", "g3": "c", "g4": "d"},
        {"c": {"g4"}, "d": {"g3"}},
        "a",
        "g2",
        None,
    ),
]


@pytest.mark.parametrize(
    ("holders", "waiting", "job", "group", "expected"),
    [pytest.param(*row[1:], id=row[0]) for row in TABLE],
)
def test_a_wait_closes_a_cycle_exactly_as_the_table_says(
    holders: Holders,
    waiting: Waiting,
    job: str,
    group: str,
    expected: tuple[str, ...] | None,
) -> None:
    found = closing_cycle(holders, waiting, job, group)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert found.jobs == expected
        _assert_real_cycle(found, holders, waiting, job, group)


def test_the_message_names_each_job_and_group_in_wait_order() -> None:
    found = closing_cycle({"g1": "a", "g2": "b"}, {"b": {"g1"}}, "a", "g2")
    assert found is not None
    assert found.message() == (
        'deadlock: job "a" waits for group "g2" held by "b", which waits for group "g1" '
        'held by "a"; acquire both in one call (phase(groups=[...])) or always in the same order'
    )
    assert found.groups == ("g2", "g1")


def test_a_three_job_message_names_all_three_groups() -> None:
    holders = {"g1": "a", "g2": "b", "g3": "c"}
    found = closing_cycle(holders, {"b": {"g3"}, "c": {"g1"}}, "a", "g2")
    assert found is not None
    assert found.edges == (
        WaitEdge("a", "g2", "b"),
        WaitEdge("b", "g3", "c"),
        WaitEdge("c", "g1", "a"),
    )
    message = found.message()
    assert message.startswith('deadlock: job "a" waits for group "g2" held by "b", ')
    assert 'which waits for group "g3" held by "c", which waits for group "g1" held by "a"' in (
        message
    )
    assert "acquire them in one call" in message
    assert "\n" not in message


def test_the_answer_does_not_depend_on_the_order_of_the_mappings() -> None:
    holders = {"g1": "a", "g2": "b", "g3": "c", "g4": "c"}
    waiting = {"b": {"g3", "g4"}, "c": {"g1"}}
    forward = closing_cycle(holders, waiting, "a", "g2")
    backward = closing_cycle(
        dict(reversed(holders.items())),
        {job: sorted(groups, reverse=True) for job, groups in reversed(waiting.items())},
        "a",
        "g2",
    )
    assert forward == backward
    assert forward is not None
    assert forward.groups == ("g2", "g3", "g1")


# -- the brute force, written differently: all-pairs distances ---------------------------

JOBS = ["a", "b", "c", "d", "e"]
GROUPS = ["g1", "g2", "g3", "g4", "g5", "g6"]
INF = 10**9


def _distances(
    holders: Mapping[str, str], waiting: Mapping[str, Collection[str]]
) -> dict[tuple[str, str], int]:
    """Floyd-Warshall over every job: the number of waits from one job to another."""
    dist = {(x, y): (0 if x == y else INF) for x in JOBS for y in JOBS}
    for waiter, groups in waiting.items():
        for group in groups:
            holder = holders.get(group)
            if holder is not None and holder != waiter:
                dist[waiter, holder] = 1
    for k, i, j in itertools.product(JOBS, JOBS, JOBS):
        if dist[i, k] + dist[k, j] < dist[i, j]:
            dist[i, j] = dist[i, k] + dist[k, j]
    return dist


def _assert_real_cycle(
    found: Deadlock,
    holders: Mapping[str, str],
    waiting: Mapping[str, Collection[str]],
    job: str,
    group: str,
) -> None:
    edges = found.edges
    assert edges[0] == WaitEdge(job, group, holders[group]), "starts with the closing wait"
    assert len(set(found.jobs)) == len(edges), "a simple cycle: no job twice"
    for edge, after in zip(edges, (*edges[1:], edges[0]), strict=True):
        assert edge.holder == after.job, "each holder waits next"
        assert holders[edge.group] == edge.holder
    for edge in edges[1:]:
        assert edge.group in waiting[edge.job], "every later edge is a real wait"


graphs = st.fixed_dictionaries(
    {
        "holders": st.dictionaries(st.sampled_from(GROUPS), st.sampled_from(JOBS)),
        "waiting": st.dictionaries(
            st.sampled_from(JOBS), st.sets(st.sampled_from(GROUPS), max_size=3)
        ),
        "job": st.sampled_from(JOBS),
        "group": st.sampled_from(GROUPS),
    }
)


@settings(max_examples=600, deadline=None)
@given(graphs)
def test_a_cycle_is_reported_exactly_when_the_holder_reaches_the_waiter(
    graph: dict[str, object],
) -> None:
    holders: dict[str, str] = graph["holders"]  # type: ignore[assignment]
    waiting: dict[str, set[str]] = graph["waiting"]  # type: ignore[assignment]
    job: str = graph["job"]  # type: ignore[assignment]
    group: str = graph["group"]  # type: ignore[assignment]
    found = closing_cycle(holders, waiting, job, group)
    head = holders.get(group)
    # The closing wait itself is not in the graph the brute force walks: its tail is the
    # end of the path, so a simple path to it never leaves it.
    others = {w: gs - {group} if w == job else gs for w, gs in waiting.items()}
    exists = head is not None and head != job and _distances(holders, others)[head, job] < INF
    assert (found is not None) == exists
    if found is not None:
        assert head is not None
        _assert_real_cycle(
            found, holders, waiting | {job: {*waiting.get(job, ()), group}}, job, group
        )
        assert len(found.edges) == _distances(holders, others)[head, job] + 1, "a shortest cycle"


@settings(max_examples=200, deadline=None)
@given(graphs)
def test_the_search_changes_none_of_its_inputs(graph: dict[str, object]) -> None:
    holders: dict[str, str] = graph["holders"]  # type: ignore[assignment]
    waiting: dict[str, set[str]] = graph["waiting"]  # type: ignore[assignment]
    before = (dict(holders), {j: set(g) for j, g in waiting.items()})
    closing_cycle(holders, waiting, graph["job"], graph["group"])  # type: ignore[arg-type]
    assert (holders, waiting) == before
