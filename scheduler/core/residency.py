"""Co-residency: which resident jobs must leave the GPUs so an incoming job fits. Pure.

The incoming job is restored beside the resident ones when its bytes fit in every node's
free device memory minus a headroom. Otherwise resident jobs are evicted least recently
used first, only as many as needed. Evicting a job frees its bytes on every node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class NodeMemory:
    """One node as its agent reported it."""

    node: str
    free_bytes: int
    """Device bytes free now (total minus used, over the node's devices)."""
    job_bytes: Mapping[str, int] = field(default_factory=dict)
    """Device bytes each job holds on this node now."""


def choose_evictions(
    incoming: Mapping[str, int],
    nodes: Sequence[NodeMemory],
    candidates: Sequence[str],
    *,
    must_evict: Sequence[str] = (),
    headroom_bytes: int = 0,
) -> tuple[str, ...]:
    """Jobs to snapshot: `must_evict`, then LRU `candidates` until `incoming` fits everywhere.

    `incoming` maps node -> bytes the incoming job needs there (absent: 0). When even
    evicting every candidate leaves a node short, every candidate is evicted (the restore
    then fails on its own, with the agent's reason).
    """
    chosen = list(must_evict)
    shortfall = {}
    for node in nodes:
        freed = sum(node.job_bytes.get(job, 0) for job in must_evict)
        need = incoming.get(node.node, 0) + headroom_bytes - node.free_bytes - freed
        if need > 0:
            shortfall[node.node] = need
    by_node = {node.node: node for node in nodes}
    for job in candidates:
        if not shortfall:
            break
        if job in chosen:
            continue
        chosen.append(job)
        for name in list(shortfall):
            shortfall[name] -= by_node[name].job_bytes.get(job, 0)
            if shortfall[name] <= 0:
                del shortfall[name]
    return tuple(chosen)


def fits(incoming: Mapping[str, int], nodes: Sequence[NodeMemory], headroom_bytes: int = 0) -> bool:
    """True when `incoming` fits beside every resident job on every node."""
    return all(incoming.get(n.node, 0) + headroom_bytes <= n.free_bytes for n in nodes)
