"""Who hears of the disk tier's moves: `recording()` collects, `tell` reports.

The tier spills and fills deep inside an agent's move; the RPC that caused it wants to say
so in its answer (the timeline's spill lane). A context variable carries the list from the
RPC's handler into the tasks it starts, so concurrent calls never see each other's moves.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, replace

__all__ = ["TierMove", "recording", "tell"]


@dataclass(frozen=True)
class TierMove:
    """Parked bytes of one job moved between host memory and the spill directory."""

    job: str
    direction: str
    """"spill" (host memory to disk) or "fill" (disk to host memory)."""
    nbytes: int
    seconds: float


_told: contextvars.ContextVar[list[TierMove] | None] = contextvars.ContextVar(
    "rlslice_tier_moves", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[TierMove]]:
    """The tier moves made while the block runs, in this context and the tasks it starts
    (a job's consecutive parts moving the same way are one move)."""
    moves: list[TierMove] = []
    token = _told.set(moves)
    try:
        yield moves
    finally:
        _told.reset(token)


def tell(job: str, direction: str, nbytes: int, seconds: float) -> None:
    """A part of `job` moved `direction`: add it to the recording under way, if any."""
    told = _told.get()
    if told is None:
        return
    last = told[-1] if told else None
    if last is not None and (last.job, last.direction) == (job, direction):
        told[-1] = replace(last, nbytes=last.nbytes + nbytes, seconds=last.seconds + seconds)
    else:
        told.append(TierMove(job, direction, nbytes, seconds))
