"""Where each job's device state is: one map job -> resident / parked / faulted.

One map, so no job is ever in two places; the views a state is read through (`resident`
in LRU order, `parked`, `faulted`) are computed once, when a map is built, and shared by
every state that keeps the map. Ranks are canonical (0, 1, ... per kind, in the kind's
order), so two maps with the same views are equal. A map is built from its views with
`place` and changed only through its operations (`with_resident`, `park`, `fault`,
`without`), each a new map.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass


class Location(enum.StrEnum):
    """Where a job's device state is, from the scheduler's point of view."""

    IDLE = "idle"
    """Registered and never ran on the group (no device state anywhere)."""
    RESIDENT = "resident"
    """On the GPUs, not holding the lock."""
    HOLDING = "holding"
    """On the GPUs and holding the lock."""
    PARKED = "parked"
    """In host DRAM."""
    FAULTED = "faulted"
    """A restore failed; the next acquire retries it."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one job's device state is, and its rank among the jobs placed alike."""

    where: Location
    """RESIDENT, PARKED or FAULTED."""
    rank: int
    """0, 1, ... in the kind's order: least recently used first (resident), first parked
    first (parked), first faulted first (faulted)."""
    reason: str = ""
    """Why the restore failed (FAULTED only)."""


class PlacementMap(Mapping[str, Placement]):
    """An immutable job -> `Placement` map with its three views."""

    __slots__ = ("_map", "faulted", "parked", "resident")

    resident: tuple[str, ...]
    """Jobs on the GPUs, least recently used first."""
    parked: tuple[str, ...]
    """Jobs in host DRAM, first parked first."""
    faulted: Mapping[str, str]
    """Job -> why its restore failed, first faulted first."""

    def __init__(self, placements: Mapping[str, Placement] | None = None) -> None:
        self._map = dict(placements or {})
        ranked = sorted(self._map.items(), key=lambda item: item[1].rank)
        self.resident = tuple(j for j, p in ranked if p.where is Location.RESIDENT)
        self.parked = tuple(j for j, p in ranked if p.where is Location.PARKED)
        self.faulted = {j: p.reason for j, p in ranked if p.where is Location.FAULTED}

    def __getitem__(self, job: str) -> Placement:
        return self._map[job]

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __repr__(self) -> str:
        return (
            f"PlacementMap(resident={self.resident}, parked={self.parked}, faulted={self.faulted})"
        )

    def with_resident(self, job: str) -> PlacementMap:
        """This map with `job` on the GPUs, the most recently used (leaving any other
        place it had)."""
        return place(
            (*(j for j in self.resident if j != job), job),
            (j for j in self.parked if j != job),
            {j: r for j, r in self.faulted.items() if j != job},
        )

    def park(self, jobs: Iterable[str]) -> PlacementMap:
        """This map with `jobs` in host DRAM, after those parked before (a job parked
        already keeps its rank; the others leave any other place they had)."""
        parked = self.parked
        moved = [j for j in jobs if j not in parked]
        gone = set(moved)
        return place(
            (j for j in self.resident if j not in gone),
            (*parked, *moved),
            {j: r for j, r in self.faulted.items() if j not in gone},
        )

    def fault(self, job: str, reason: str) -> PlacementMap:
        """This map with `job` faulted for `reason`, after those faulted before (a job
        faulted already keeps its rank and takes the new reason; leaving any other place)."""
        return place(
            (j for j in self.resident if j != job),
            (j for j in self.parked if j != job),
            {**self.faulted, job: reason},
        )

    def without(self, job: str) -> PlacementMap:
        """This map with `job` placed nowhere."""
        if job not in self._map:
            return self
        return place(
            (j for j in self.resident if j != job),
            (j for j in self.parked if j != job),
            {j: r for j, r in self.faulted.items() if j != job},
        )


def place(
    resident: Iterable[str] = (),
    parked: Iterable[str] = (),
    faulted: Mapping[str, str] | None = None,
) -> PlacementMap:
    """The map of the three views. A job named twice keeps its last place, in the order
    resident, parked, faulted (named twice in one view: its last rank)."""
    return _assign(
        (
            (Location.RESIDENT, [(job, "") for job in resident]),
            (Location.PARKED, [(job, "") for job in parked]),
            (Location.FAULTED, list((faulted or {}).items())),
        )
    )


def _assign(groups: Iterable[tuple[Location, list[tuple[str, str]]]]) -> PlacementMap:
    """Place each (job, reason) of each group in turn, a later place replacing an earlier
    one; then rank each kind canonically."""
    kinds: dict[str, tuple[Location, str]] = {}
    for where, jobs in groups:
        for job, reason in jobs:
            kinds.pop(job, None)
            kinds[job] = (where, reason)
    ranks = dict.fromkeys(Location, 0)
    out: dict[str, Placement] = {}
    for job, (where, reason) in kinds.items():
        out[job] = Placement(where, ranks[where], reason)
        ranks[where] += 1
    return PlacementMap(out)


EMPTY = PlacementMap()
"""The map of a group where nothing ran yet."""
