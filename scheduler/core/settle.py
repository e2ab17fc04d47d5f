"""How a switch went, from what its calls did: `settle(epoch, plan, outcomes, undo)`. Pure.

The coordinator runs a planned switch's calls (one Switch per node, or serial Snapshot and
Restore calls) and undoes what went through when one failed; this module says what that
means for the core:

- nothing failed: SwitchDone, with every move that took place;
- a snapshot failed (or a node's Switch was refused or cut off before it said which half
  failed): SnapshotFailed; the outgoing jobs run on where they were undone;
- only a restore failed and it was undone everywhere (overlapped): RestoreFailed with
  nothing evicted, so a retry may evict again; not undone (serial: the snapshots hold):
  RestoreFailed with the plan's evicted jobs parked;
- jobs are *unsure* when a call was cut off (its deadline passed, the connection broke
  mid-call: what the node did is unknown) or their undo failed: they may be parked there
  after all, and SnapshotFailed names them even when only a restore failed.

What a waiter is told (`waiter_error`) follows from what the agent's answer meant.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from rlslice._errors import (
    AbortedError,
    DeadlineExceededError,
    FailedPreconditionError,
    ResourceExhaustedError,
    RlsliceError,
    UnavailableError,
)
from rlslice.scheduler.core.events import (
    Event,
    MoveKind,
    NodeMove,
    PartsParked,
    RestoreFailed,
    SnapshotFailed,
    SwitchDone,
)
from rlslice.scheduler.core.moves import MovePlan

__all__ = [
    "CallFailure",
    "NodeOutcome",
    "Undo",
    "UndoKind",
    "parts_parked",
    "settle",
    "waiter_error",
]


@dataclass(frozen=True, slots=True)
class CallFailure:
    """One agent call that failed for good."""

    message: str
    """One line naming the node, the call and why."""
    error: type[RlsliceError]
    """What the agent's answer meant (the gRPC status, translated)."""
    cut_off: bool = False
    """The call went out but no answer came back: what the node did is unknown."""

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """What one node's Switch (or one serial call) did."""

    node: str
    moved: int = 0
    """Bytes moved there (snapshots and restore)."""
    restored_bytes: int = 0
    snapped: tuple[str, ...] = ()
    """Jobs snapshotted there (not absent)."""
    restored: str | None = None
    """The job restored there (not absent)."""
    failure: CallFailure | None = None
    failed_move: MoveKind = MoveKind.SNAPSHOT
    unsure: tuple[str, ...] = ()
    """Jobs that may be parked there after all (cut off mid-call, a failed undo there)."""
    done: tuple[NodeMove, ...] = ()
    """The moves that took place there."""

    @property
    def moved_any(self) -> bool:
        return bool(self.snapped) or self.restored is not None


class UndoKind(enum.StrEnum):
    """How a failed switch's moves were undone (the words a waiter's reason uses)."""

    ROLLED_BACK = "rolled back"
    """Serial snapshots restored."""
    SWITCHED_BACK = "switched back"
    """A node's Switch undone."""


@dataclass(frozen=True, slots=True)
class Undo:
    """How the coordinator undid what went through once a call failed."""

    how: UndoKind
    count: int
    """What was undone: rolled-back snapshots, or nodes switched back."""
    left: tuple[str, ...] = ()
    """Jobs whose undo failed: parked there still."""


def waiter_error(error: type[RlsliceError]) -> type[RlsliceError]:
    """The error a waiter sees for an agent's failure. A call that never got an answer is
    ABORTED, not UNAVAILABLE: clients retry UNAVAILABLE as a scheduler outage, and would
    freeze and roll back the outgoing job again and again. Host memory short stays
    RESOURCE_EXHAUSTED (the outgoing job runs on); anything else is a failed precondition."""
    if issubclass(error, UnavailableError | DeadlineExceededError):
        return AbortedError
    if issubclass(error, ResourceExhaustedError):
        return ResourceExhaustedError
    return FailedPreconditionError


def parts_parked(plan: MovePlan) -> dict[str, PartsParked]:
    """Each evicted job that `plan` moves only partly on some node -> the tags it offloads
    and discards over all nodes (in move order, each once), and whether a node moves it
    whole."""
    out: dict[str, PartsParked] = {}
    for job in plan.evict:
        plans = [n.partial[job] for n in plan.nodes if job in n.partial]
        if not plans:
            continue
        out[job] = PartsParked(
            offloaded=tuple(dict.fromkeys(t for p in plans for t in p.offload)),
            discarded=tuple(dict.fromkeys(t for p in plans for t in p.discard)),
            whole=any(job in n.snapshot and job not in n.partial for n in plan.nodes),
        )
    return out


def settle(epoch: int, plan: MovePlan, outcomes: Sequence[NodeOutcome], undo: Undo | None) -> Event:
    """The event for switch `epoch` whose calls ended in `outcomes`; `undo`: how what went
    through was undone after a failure (None: it was not, the snapshots hold)."""
    failed = [o for o in outcomes if o.failure is not None]
    if not failed:
        return SwitchDone(
            epoch,
            plan.evict,
            sum(o.moved for o in outcomes),
            restored_bytes=sum(o.restored_bytes for o in outcomes),
            moves=tuple(m for o in outcomes for m in o.done),
            parts=parts_parked(plan),
        )
    failures = [o.failure for o in failed if o.failure is not None]
    reason = "; ".join(str(f) for f in failures)
    if undo is None:
        moved = sum(o.moved for o in outcomes)
        return RestoreFailed(epoch, reason, plan.evict, moved, parts_parked(plan))
    if undo.count:
        reason += f" ({undo.how} on {undo.count} node(s))"
    unsure = tuple(dict.fromkeys([*(j for o in failed for j in o.unsure), *undo.left]))
    snapshots = [o.failure for o in failed if o.failed_move is MoveKind.SNAPSHOT and o.failure]
    if snapshots:
        return SnapshotFailed(epoch, reason, waiter_error(snapshots[0].error), unsure)
    if unsure:
        return SnapshotFailed(epoch, reason, waiter_error(failures[0].error), unsure)
    # Undone everywhere: nothing was evicted, so a retry may evict again.
    return RestoreFailed(epoch, reason, (), 0)
