"""Co-residency decisions.

Cases: fits beside residents -> no eviction; short on one node -> evict LRU first, only as
many as needed; must-evict jobs count as freed; headroom is honoured; nothing can make room
-> every candidate; no nodes -> nothing.
"""

from __future__ import annotations

import pytest

from rlslice.scheduler.core import NodeMemory, choose_evictions, fits

GIB = 1 << 30


def _nodes(free: list[int], bytes_a: int = 2 * GIB, bytes_b: int = 3 * GIB) -> list[NodeMemory]:
    return [NodeMemory(f"n{i}", f, {"a": bytes_a, "b": bytes_b}) for i, f in enumerate(free)]


@pytest.mark.parametrize(
    ("free", "need", "must", "headroom", "expected"),
    [
        ([8 * GIB, 8 * GIB, 8 * GIB], 4 * GIB, (), 0, ()),
        ([8 * GIB, 3 * GIB, 8 * GIB], 4 * GIB, (), 0, ("a",)),
        ([8 * GIB, 1 * GIB, 8 * GIB], 4 * GIB, (), 0, ("a", "b")),
        ([8 * GIB, 8 * GIB, 8 * GIB], 4 * GIB, (), 5 * GIB, ("a",)),
        ([2 * GIB, 8 * GIB, 8 * GIB], 4 * GIB, ("b",), 0, ("b",)),
        ([0, 0, 0], 100 * GIB, (), 0, ("a", "b")),
    ],
)
def test_the_incoming_job_stays_beside_residents_unless_memory_demands(
    free: list[int], need: int, must: tuple[str, ...], headroom: int, expected: tuple[str, ...]
) -> None:
    nodes = _nodes(free)
    incoming = {n.node: need for n in nodes}
    chosen = choose_evictions(incoming, nodes, ["a", "b"], must_evict=must, headroom_bytes=headroom)
    assert chosen == expected
    assert fits(incoming, nodes, headroom) == (expected == ())


def test_no_nodes_means_nothing_to_evict() -> None:
    assert choose_evictions({}, [], ["a", "b"]) == ()
