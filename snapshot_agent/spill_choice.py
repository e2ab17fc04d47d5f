"""Which parked parts go to disk when parking more would break the host budget (pure).

The agent may keep at most `budget` bytes of parked state in host memory. Before it parks
`incoming` more bytes it asks `choose()`: the parts to spill, least recently used job
first (the job parked longest ago), each job's parts in name order, until what stays in
host memory plus the incoming bytes fits the budget, and at least `shortfall` bytes more
when host memory itself is short (the reserve). Parts of the jobs in `keep` (the job being
parked, a job being restored, a job another move holds) never move. When even spilling
every other part would not keep the budget, the plan says why, and nothing is spilled; a
shortfall that spilling cannot cover is the host-memory guard's to refuse, not the plan's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass

from rlslice.units import format_bytes

__all__ = ["ParkedPart", "SpillPlan", "choose"]


@dataclass(frozen=True)
class ParkedPart:
    """One part of a parked job, in host memory."""

    job: str
    name: str
    nbytes: int
    parked_at: float
    """When the job was parked (any clock, compared only with other parts' times)."""


@dataclass(frozen=True)
class SpillPlan:
    """What to spill before parking more."""

    spill: tuple[ParkedPart, ...] = ()
    """The parts to move to disk, in this order."""
    refusal: str | None = None
    """Why the park cannot fit even with every other part spilled; None when it can."""

    @property
    def nbytes(self) -> int:
        """Bytes the plan moves to disk."""
        return sum(part.nbytes for part in self.spill)


def choose(
    parts: Iterable[ParkedPart],
    *,
    incoming: int,
    budget: int,
    keep: Set[str] = frozenset(),
    pending: int = 0,
    shortfall: int = 0,
) -> SpillPlan:
    """The parts to spill so that `incoming` more bytes fit in `budget`, and that free at
    least `shortfall` bytes (as many as there are, if fewer).

    `parts`: every part now in host memory; `pending`: bytes other moves under way will
    still add (reserved, not yet there)."""
    resident = list(parts)
    used = sum(part.nbytes for part in resident) + pending
    over = used + incoming - budget
    need = max(over, shortfall)
    if need <= 0:
        return SpillPlan()
    candidates = _lru_order(p for p in resident if p.job not in keep and p.nbytes > 0)
    chosen: list[ParkedPart] = []
    freed = 0
    for part in candidates:
        if freed >= need:
            break
        chosen.append(part)
        freed += part.nbytes
    if freed < over:
        return SpillPlan(
            refusal=(
                f"host budget: parking {format_bytes(incoming)} beside "
                f"{format_bytes(used)} exceeds the budget of {format_bytes(budget)}, and "
                f"spilling every other parked part frees only {format_bytes(freed)}"
            )
        )
    return SpillPlan(tuple(chosen))


def _lru_order(parts: Iterable[ParkedPart]) -> Sequence[ParkedPart]:
    return sorted(parts, key=lambda p: (p.parked_at, p.job, p.name))
