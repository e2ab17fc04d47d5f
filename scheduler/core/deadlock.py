"""Wait-for cycles across groups: find the deadlock a new wait (or a new holder) closes.

Each group has one lock, so two jobs that take two groups in opposite orders (a holds g1 and
waits for g2 while b holds g2 and waits for g1) would wait for ever. The wait-for graph has
an edge from every waiting job to the holder of the group it waits for; a deadlock is a
cycle. The engine keeps the graph acyclic by checking each edge as it appears: when a job
starts to wait, and when a group gets a new holder that jobs already wait on. An edge closes
a cycle exactly when the holder at its head reaches its tail, so one search from the head,
over waiting jobs only, answers it.

Pure: plain mappings in, a frozen value (or None) out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WaitEdge:
    """`job` waits for `group`, which `holder` holds."""

    job: str
    group: str
    holder: str


@dataclass(frozen=True, slots=True)
class Deadlock:
    """A wait-for cycle, first edge first: the wait that closed it.

    `edges[i].holder == edges[i + 1].job`, and the last edge's holder is the first's job.
    """

    edges: tuple[WaitEdge, ...]

    @property
    def jobs(self) -> tuple[str, ...]:
        """The jobs of the cycle, in wait order, the closing waiter first."""
        return tuple(edge.job for edge in self.edges)

    @property
    def groups(self) -> tuple[str, ...]:
        """The groups of the cycle, in wait order, the closing wait's group first."""
        return tuple(edge.group for edge in self.edges)

    def message(self) -> str:
        """One line naming every job and group of the cycle and what to do instead."""
        first, *rest = self.edges
        text = (
            f'deadlock: job "{first.job}" waits for group "{first.group}" held by "{first.holder}"'
        )
        for edge in rest:
            text += f', which waits for group "{edge.group}" held by "{edge.holder}"'
        both = "both" if len(self.edges) == 2 else "them"
        return (
            f"{text}; acquire {both} in one call (phase(groups=[...])) or always in the same order"
        )


def closing_cycle(
    holders: Mapping[str, str],
    waiting: Mapping[str, Collection[str]],
    job: str,
    group: str,
) -> Deadlock | None:
    """The wait-for cycle through `job` waiting for `group`, or None when there is none.

    `holders` maps each held group to its holder (groups nobody holds are absent);
    `waiting` maps a job to the groups it waits for (the wait of `job` for `group` need not
    be in it). The search walks from the holder of `group` along waits only, breadth first,
    so the cycle returned is a shortest one; groups are visited in sorted order, so the
    answer does not depend on the mappings' order. A job waiting for a group it holds is
    not a cycle (the scheduler refuses that wait on its own).
    """
    head = holders.get(group)
    if head is None or head == job:
        return None
    # For each job reached: the edge it was reached by (None for the head).
    reached: dict[str, WaitEdge | None] = {head: None}
    frontier = deque([head])
    while frontier:
        waiter = frontier.popleft()
        for wanted in sorted(waiting.get(waiter, ())):
            holder = holders.get(wanted)
            if holder is None or holder in reached or holder == waiter:
                continue
            reached[holder] = WaitEdge(waiter, wanted, holder)
            if holder == job:
                return Deadlock((WaitEdge(job, group, head), *_path_to(reached, job)))
            frontier.append(holder)
    return None


def _path_to(reached: Mapping[str, WaitEdge | None], job: str) -> tuple[WaitEdge, ...]:
    """The edges from the search's head to `job`, in order."""
    path: list[WaitEdge] = []
    edge = reached[job]
    while edge is not None:
        path.append(edge)
        edge = reached[edge.job]
    return tuple(reversed(path))
