"""Actions out of the group state machine: what the service and the coordinator must do."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rlslice._errors import RlsliceError
from rlslice.scheduler.core.state import Switch


class Kind(enum.StrEnum):
    """What happened, for the event ring (mirrors the protocol's EventKind)."""

    REGISTERED = "registered"
    UNREGISTERED = "unregistered"
    QUEUED = "queued"
    GRANTED = "granted"
    YIELDED = "yielded"
    CANCELLED = "cancelled"
    LEASE_EXPIRED = "lease_expired"
    SWITCH_STARTED = "switch_started"
    SWITCH_DONE = "switch_done"
    SWITCH_FAILED = "switch_failed"
    FAULTED = "faulted"
    YIELD_REQUESTED = "yield_requested"
    PREEMPTED = "preempted"
    GROUP_PUT = "group_put"
    GROUP_DELETED = "group_deleted"
    FAILED = "failed"
    PREFETCH = "prefetch"
    SNAPSHOT_DONE = "snapshot_done"
    RESTORE_DONE = "restore_done"
    SPILL_DONE = "spill_done"
    FILL_DONE = "fill_done"


@dataclass(frozen=True, slots=True)
class StartSwitch:
    """Run `switch` over the group's agents, then report SwitchDone or a failure event."""

    switch: Switch
    resume: bool = False
    """True when a switch interrupted by a restart is being completed."""


@dataclass(frozen=True, slots=True)
class GrantAction:
    """Answer acquire `ticket` of `job`: it holds the group now. `ticket` is None for a
    switch resumed after a restart whose caller has not called again yet."""

    job: str
    ticket: int | None
    epoch: int
    waited_seconds: float
    restored: bool = False
    switch_seconds: float = 0.0
    moved_bytes: int = 0
    discarded: tuple[str, ...] = ()
    """Tags of the job's `discard` parts freed while it was parked: it rebuilds them."""


@dataclass(frozen=True, slots=True)
class Fail:
    """Fail acquire `ticket` of `job` with an error of `kind` and a one-line reason."""

    job: str
    ticket: int
    kind: type[RlsliceError]
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """The holder `job` is being snapshotted while it believes it holds."""

    job: str


@dataclass(frozen=True, slots=True)
class ReleaseState:
    """Tell the agents to drop `job`'s state: at once when `force`, else once its processes exit."""

    job: str
    force: bool


@dataclass(frozen=True, slots=True)
class Yielded:
    """The answer to a Yield."""

    job: str
    waiters: int
    snapshot_deferred: bool


@dataclass(frozen=True, slots=True)
class HoldEnded:
    """`job` stopped holding after `seconds` (for the held-seconds metric)."""

    job: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Record:
    """An entry for the group's event ring."""

    kind: Kind
    job: str = ""
    detail: str = ""
    seconds: float = 0.0
    bytes: int = 0


Action = StartSwitch | GrantAction | Fail | Preempt | ReleaseState | Yielded | HoldEnded | Record
