"""The per-job state machine of one agent. Pure: plain values in, plain values out.

    RUNNING --snapshot--> SAVING --ok--> PARKED --restore--> RESTORING --ok--> RUNNING
                            |                                   |
                            +--fail--> FAULTED(snapshot)        +--fail--> FAULTED(restore)

A failed snapshot is rolled back by the backend, so FAULTED(snapshot) holds its device state
on the device (the job runs again) and may be snapshotted again; FAULTED(restore) holds its
state in host memory and may be restored again. A successful retry clears the fault; so does
dropping the job (Release).

Every move carries the group's epoch and names the job's group. `admit()` answers, before
anything is done, for a single move and for each half of a switch alike:

- a job of another group -> `Refuse(WRONG_GROUP)`;
- otherwise what `decide()` answers:

- the same move with the same epoch as the job's last move, and nothing changed since ->
  `Repeat` (the earlier result, marked repeated; nothing acts twice);
- an epoch older than the job's last move -> `Refuse(STALE)`;
- a snapshot of a job with no live process here -> `Absent` (groups span nodes);
- a restore of a job this node never had -> `Absent`;
- a restore of a job that is not parked, a snapshot of one that is -> `Refuse(NOT_ALLOWED)`;
- otherwise `Proceed`: the caller runs `begin()`, the backend, then `succeed()` or `fail()`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any


class JobState(enum.StrEnum):
    """Where a job stands on one node."""

    RUNNING = "running"
    SAVING = "saving"
    PARKED = "parked"
    RESTORING = "restoring"
    FAULTED = "faulted"


class Move(enum.StrEnum):
    """The two things an agent does to a job."""

    SNAPSHOT = "snapshot"
    RESTORE = "restore"


@dataclass(frozen=True)
class MoveResult:
    """The outcome of one finished move, kept to answer a repeated call."""

    move: Move
    epoch: int
    state: JobState
    """The job's state right after the move."""
    bytes: int
    seconds: float
    backend: str


@dataclass(frozen=True)
class AgentJobRecord:
    """One job on this node."""

    job: str
    group: str
    state: JobState = JobState.RUNNING
    reason: str = ""
    """Why FAULTED; empty otherwise."""
    faulted_in: Move | None = None
    """Which move failed, while FAULTED (tells where the device state is)."""
    epoch: int = 0
    """Epoch of the last move started on this job."""
    last: MoveResult | None = None
    """The last finished move (successful or not, a failed one has state FAULTED)."""
    parked_bytes: int = 0
    """Host bytes the parked state takes (0 unless parked or faulted in restore)."""
    backend: str = ""
    """Backend that holds the parked state (empty when the job never moved)."""
    released: bool = False
    """The scheduler released the job (its lease ended) while its processes lived: its
    parked state is dropped as soon as they are gone. A move clears it (the scheduler
    uses the job again)."""

    @property
    def state_on_device(self) -> bool:
        """True when the job's device state is on the device (it may run)."""
        return self.state is JobState.RUNNING or (
            self.state is JobState.FAULTED and self.faulted_in is Move.SNAPSHOT
        )

    @property
    def state_in_host(self) -> bool:
        """True when the job's device state sits in host memory."""
        return self.state is JobState.PARKED or (
            self.state is JobState.FAULTED and self.faulted_in is Move.RESTORE
        )


class Refusal(enum.StrEnum):
    """Why a move may not go ahead."""

    STALE = "stale"
    """The epoch is older than the job's last move."""
    NOT_ALLOWED = "not-allowed"
    """The job's state does not allow this move (restore of a running job, say)."""
    BUSY = "busy"
    """Another move of this job is under way."""
    WRONG_GROUP = "wrong-group"
    """The job is registered in another group on this node."""


@dataclass(frozen=True)
class Proceed:
    """Go ahead: `begin()`, run the backend, then `succeed()` or `fail()`."""


@dataclass(frozen=True)
class Repeat:
    """Answer with this earlier result, marked repeated."""

    result: MoveResult


@dataclass(frozen=True)
class Absent:
    """The job has nothing on this node: answer absent, change nothing."""


@dataclass(frozen=True)
class Refuse:
    """Refuse the call; the message is one line and names the job."""

    why: Refusal
    message: str


Decision = Proceed | Repeat | Absent | Refuse


def decide(
    record: AgentJobRecord | None, move: Move, epoch: int, *, has_processes: bool
) -> Decision:
    """What to do with a move request, given the job's record and whether it has processes."""
    if record is None:
        return Absent()
    last = record.last
    if (
        last is not None
        and (last.move, last.epoch) == (move, epoch)
        and last.state is record.state
        and last.state is not JobState.FAULTED
    ):
        return Repeat(last)
    if epoch < record.epoch:
        return Refuse(
            Refusal.STALE,
            f"epoch: {epoch} is older than job {record.job}'s last move (epoch {record.epoch})",
        )
    if record.state in (JobState.SAVING, JobState.RESTORING):
        return Refuse(
            Refusal.BUSY, f"job {record.job} is {record.state.value}: another move is under way"
        )
    if move is Move.SNAPSHOT:
        if record.state_in_host:
            return Refuse(Refusal.NOT_ALLOWED, f"job {record.job} is parked already")
        if not has_processes:
            return Absent()
        return Proceed()
    if not record.state_in_host:
        return Refuse(
            Refusal.NOT_ALLOWED,
            f"job {record.job} is not parked (it is {record.state.value}): nothing to restore",
        )
    if not has_processes:
        return Refuse(
            Refusal.NOT_ALLOWED,
            f"job {record.job} has no live process on this node: release its parked state",
        )
    return Proceed()


def admit(
    record: AgentJobRecord | None,
    move: Move,
    epoch: int,
    *,
    group: str,
    node: str,
    has_processes: bool,
) -> Decision:
    """What to do with a move of a job asked for by `group` on `node`: refused when the job
    is in another group, else what `decide` says."""
    if record is not None and record.group != group:
        return Refuse(
            Refusal.WRONG_GROUP,
            f"group: job {record.job} is in group {record.group} on node {node}, not {group}",
        )
    return decide(record, move, epoch, has_processes=has_processes)


def begin(record: AgentJobRecord, move: Move, epoch: int, backend: str) -> AgentJobRecord:
    """The record while `move` runs."""
    state = JobState.SAVING if move is Move.SNAPSHOT else JobState.RESTORING
    return replace(record, state=state, epoch=epoch, backend=backend, released=False)


def succeed(
    record: AgentJobRecord, move: Move, epoch: int, nbytes: int, seconds: float
) -> AgentJobRecord:
    """The record after `move` worked: the fault (if any) is cleared."""
    state = JobState.PARKED if move is Move.SNAPSHOT else JobState.RUNNING
    result = MoveResult(move, epoch, state, nbytes, seconds, record.backend)
    return replace(
        record,
        state=state,
        reason="",
        faulted_in=None,
        epoch=epoch,
        last=result,
        parked_bytes=nbytes if move is Move.SNAPSHOT else 0,
    )


def fail(
    record: AgentJobRecord, move: Move, epoch: int, reason: str, seconds: float
) -> AgentJobRecord:
    """The record after `move` failed (and the backend rolled back what it could)."""
    result = MoveResult(move, epoch, JobState.FAULTED, 0, seconds, record.backend)
    return replace(
        record,
        state=JobState.FAULTED,
        reason=reason.splitlines()[0] if reason else f"{move.value} failed",
        faulted_in=move,
        epoch=epoch,
        last=result,
    )


def release_kept(record: AgentJobRecord) -> AgentJobRecord:
    """The record after a Release that keeps the job's state while its processes live."""
    return replace(record, released=True)


def released_running(record: AgentJobRecord) -> AgentJobRecord:
    """The record after the job's parked copy was dropped while its processes run (it
    unregistered, then ends): running, nothing parked, released."""
    return replace(
        record, state=JobState.RUNNING, parked_bytes=0, reason="", faulted_in=None, released=True
    )


def recovered(record: AgentJobRecord, backend_says: str) -> AgentJobRecord:
    """The record after an agent restart, given the backend's view.

    `backend_says` is "running", "parked", "failed" or "unknown" (the backend's
    `BackendState` value). A move that was under way when the agent stopped is settled the
    way the backend found it.
    """
    if backend_says == "running":
        if record.state is JobState.RUNNING or record.state_on_device:
            return record
        return replace(record, state=JobState.RUNNING, reason="", faulted_in=None, parked_bytes=0)
    if backend_says == "parked":
        if record.state is JobState.PARKED:
            return record
        return replace(record, state=JobState.PARKED, reason="", faulted_in=None)
    if backend_says == "failed":
        return replace(
            record,
            state=JobState.FAULTED,
            reason=record.reason or "the backend reports a failed move",
            faulted_in=record.faulted_in or Move.RESTORE,
        )
    if record.state in (JobState.SAVING, JobState.RESTORING):
        move = Move.SNAPSHOT if record.state is JobState.SAVING else Move.RESTORE
        return replace(
            record,
            state=JobState.FAULTED,
            reason="the agent stopped during the move",
            faulted_in=move,
        )
    return record


def to_dict(record: AgentJobRecord) -> dict[str, Any]:
    """A JSON-ready form of `record` (for the agent's state file)."""
    last = record.last
    return {
        "job": record.job,
        "group": record.group,
        "state": record.state.value,
        "reason": record.reason,
        "faulted_in": record.faulted_in.value if record.faulted_in else None,
        "epoch": record.epoch,
        "parked_bytes": record.parked_bytes,
        "backend": record.backend,
        "released": record.released,
        "last": None
        if last is None
        else {
            "move": last.move.value,
            "epoch": last.epoch,
            "state": last.state.value,
            "bytes": last.bytes,
            "seconds": last.seconds,
            "backend": last.backend,
        },
    }


def from_dict(data: dict[str, Any]) -> AgentJobRecord:
    """The record `to_dict` wrote. Raises KeyError or ValueError on a damaged entry."""
    last = data.get("last")
    return AgentJobRecord(
        job=str(data["job"]),
        group=str(data["group"]),
        state=JobState(data["state"]),
        reason=str(data.get("reason", "")),
        faulted_in=Move(data["faulted_in"]) if data.get("faulted_in") else None,
        epoch=int(data.get("epoch", 0)),
        parked_bytes=int(data.get("parked_bytes", 0)),
        backend=str(data.get("backend", "")),
        released=bool(data.get("released", False)),
        last=None
        if not last
        else MoveResult(
            move=Move(last["move"]),
            epoch=int(last["epoch"]),
            state=JobState(last["state"]),
            bytes=int(last["bytes"]),
            seconds=float(last["seconds"]),
            backend=str(last["backend"]),
        ),
    )
