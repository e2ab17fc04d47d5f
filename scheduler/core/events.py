"""Events into the group state machine. Time is never inside an event: `step` takes `now`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from rlslice._errors import RlsliceError, UnavailableError
from rlslice.config import GroupSpec


@dataclass(frozen=True, slots=True)
class Register:
    """A job opens a lease in the group."""

    job: str
    lease_id: str
    secret_hash: str
    lease_seconds: float
    priority: int | None = None
    """The job's own value when set; a job the group spec lists takes the spec's (the
    admin's) priority and weight instead."""
    weight: float | None = None
    device_bytes: int = 0
    session: str = ""
    """The registering client instance, for the deadlock check ("" if unsaid)."""
    lock_only: bool = False
    """No agent of the group knows the job (see `core.registration`)."""


@dataclass(frozen=True, slots=True)
class Unregister:
    """A job closes its lease: it leaves everything and its parked state is dropped."""

    job: str


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """A job renews its lease."""

    job: str


@dataclass(frozen=True, slots=True)
class Acquire:
    """A job asks for the lock; `ticket` identifies the call."""

    job: str
    ticket: int
    phase: str = ""


@dataclass(frozen=True, slots=True)
class Cancel:
    """The caller of acquire `ticket` went away (cancelled, deadline passed)."""

    job: str
    ticket: int


@dataclass(frozen=True, slots=True)
class Yield:
    """The holder gives the lock up."""

    job: str


@dataclass(frozen=True, slots=True)
class LostGrant:
    """The grant at `epoch` was decided but its caller went away before reading it: yield
    for the job, unless its client has since been told it holds (`acknowledged`)."""

    job: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: lapse leases, ask holders past max_hold to yield, preempt after grace."""


class MoveKind(StrEnum):
    """One half of a switch on one node (the agent's word in a SwitchFailure's `move`)."""

    SNAPSHOT = "snapshot"
    """Device to host: the job is parked there."""
    RESTORE = "restore"
    """Host to device: the job is resident there again."""
    SPILL = "spill"
    """Host memory to the agent's disk tier: parked bytes of the job on disk (a move the
    agent made to keep its host budget, told in a snapshot's or restore's answer)."""
    FILL = "fill"
    """The agent's disk tier back to host memory: the job is parked in host memory again."""


@dataclass(frozen=True, slots=True)
class NodeMove:
    """One snapshot or restore that moved a job's state on one node."""

    node: str
    job: str
    move: MoveKind
    bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class PartsParked:
    """What partial snapshots did with one evicted job's parts, over the nodes."""

    offloaded: tuple[str, ...] = ()
    """Tags copied to host memory (on some node)."""
    discarded: tuple[str, ...] = ()
    """Tags freed without a copy (on some node): the job rebuilds them."""
    whole: bool = False
    """Some node moved the job whole: every part of it is parked there."""


@dataclass(frozen=True, slots=True)
class SwitchDone:
    """The coordinator evicted `evicted` and restored the incoming job."""

    epoch: int
    evicted: tuple[str, ...] = ()
    moved_bytes: int = 0
    seconds: float = 0.0
    restored_bytes: int | None = None
    """Bytes the incoming job's restores brought back (None: not told apart from the
    snapshots' bytes; `moved_bytes` stands in). The grant says `restored` only when some
    came back: a job no agent knows was restored from nothing."""
    moves: tuple[NodeMove, ...] = ()
    parts: Mapping[str, PartsParked] = field(default_factory=dict)
    """Evicted jobs that moved only some parts on some node -> what moved."""
    """Every move that took place, per node (one ring event each: the timeline's moves)."""


@dataclass(frozen=True, slots=True)
class SnapshotFailed:
    """A snapshot failed on some node; the coordinator rolled the others back."""

    epoch: int
    reason: str
    kind: type[RlsliceError] = UnavailableError
    unsure: tuple[str, ...] = ()
    """Jobs that may be parked on some node after all (a node cut off mid-call, a rollback
    that failed): counted parked, so their next grant asks the agents and restores them
    where they are parked (a restore where they run moves nothing)."""


@dataclass(frozen=True, slots=True)
class SwitchFailed:
    """The switch was abandoned before anything moved for good (rolled back)."""

    epoch: int
    reason: str
    kind: type[RlsliceError] = UnavailableError


@dataclass(frozen=True, slots=True)
class PrefetchSkipped:
    """A prefetch was not run: the waiter does not fit beside the holder (nothing moved
    onto the devices; `moves`: what the agents read back from disk into host memory for
    it instead, and spilled to make room, see `MoveKind.FILL`)."""

    epoch: int
    reason: str
    moves: tuple[NodeMove, ...] = ()


@dataclass(frozen=True, slots=True)
class RestoreFailed:
    """Restoring the incoming job failed after `evicted` were parked."""

    epoch: int
    reason: str
    evicted: tuple[str, ...] = ()
    moved_bytes: int = 0
    parts: Mapping[str, PartsParked] = field(default_factory=dict)
    """As `SwitchDone.parts`, for the evictions that stand."""


@dataclass(frozen=True, slots=True)
class PutGroup:
    """The group's spec is replaced."""

    spec: GroupSpec


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """The group is deleted (refused while held unless `force`)."""

    force: bool = False


@dataclass(frozen=True, slots=True)
class Recover:
    """The scheduler restarted: callers are gone, leases get a fresh term, a switch resumes."""


Event = (
    Register
    | Unregister
    | KeepAlive
    | Acquire
    | Cancel
    | Yield
    | LostGrant
    | Tick
    | SwitchDone
    | SnapshotFailed
    | SwitchFailed
    | RestoreFailed
    | PrefetchSkipped
    | PutGroup
    | DeleteGroup
    | Recover
)
