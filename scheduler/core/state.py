"""The state of one group, as immutable values.

Every transition builds a new `GroupState` with `dataclasses.replace`; nothing here is ever
mutated, so a state can be persisted, shown in an event or compared after the fact.
Where a job stands is derived from one place each: `holder`, `queue`, and `placement`, one
map job -> resident / parked / faulted (so no job is in two places by construction), read
through the views `resident` (least recently used first), `parked` and `faulted`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from rlslice.config import GroupSpec
from rlslice.scheduler.core.placement import EMPTY, Location, PlacementMap


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A registered job: its lease and its scheduling inputs."""

    name: str
    lease_id: str
    secret_hash: str
    """A hash of the lease secret (never the secret itself)."""
    lease_seconds: float
    expires_at: float
    """Unix time the lease lapses unless renewed."""
    priority: int = 0
    weight: float = 1.0
    device_bytes: int = 0
    """Device bytes the job said it expects to hold on each node (0: unknown)."""
    held_seconds: float = 0.0
    """Seconds the job has held the lock (closed holds only)."""
    session: str = ""
    """The client instance that registered (see `RegisterRequest.session`); "" if unsaid."""
    last_served_at: float | None = None
    """When the job's last hold of the group ended (`lrs` policy); None: never served."""
    phase: str = ""
    """The phase the job last asked for: the one it waits for, or holds once granted."""
    lock_only: bool = False
    """No agent of the group knew the job when it registered (`core.registration`): it
    takes turns on the lock, but nothing of it moves. It leaves with the job's lease."""
    discarded: tuple[str, ...] = ()
    """Tags of its `discard` parts a partial snapshot freed since the job was last granted:
    its next grant tells the job (`Grant.discarded`, to rebuild them), then clears this."""
    told_discarded: tuple[str, ...] = ()
    """The tags the current hold's grant told (`Grant.discarded`), kept until the hold ends
    in case that answer never reached the job: a `LostGrant` puts them back in `discarded`
    (its next grant tells them again), and GetGroup shows them while it holds (a client
    re-issuing a lost Acquire reads them back). () when it does not hold."""
    parked_parts: tuple[str, ...] = ()
    """The tags in host memory while only some of its parts are parked (the rest stayed on
    the device); () when it is parked whole or on the GPUs."""


@dataclass(frozen=True, slots=True)
class Waiter:
    """One blocked acquire."""

    job: str
    ticket: int
    """Identifies the call; a cancel names the ticket so a late cancel never hits a newer call."""
    since: float
    phase: str = ""
    attached: bool = True
    """False after a scheduler restart until the job's client calls Acquire again."""


class SwitchKind(enum.StrEnum):
    """What a switch is for (`Switch.purpose`); stored and shown as its value."""

    GRANT = "grant"
    """End in a grant to `incoming`."""
    PREFETCH = "prefetch"
    """Restore `incoming` (the head waiter) beside the holder before it yields; no grant,
    the holder never evicted."""
    UNPREFETCH = "unprefetch"
    """Park `incoming` again (a prefetched waiter left)."""


@dataclass(frozen=True, slots=True)
class Switch:
    """A switch in flight: evict some jobs, restore `incoming`, then grant it."""

    incoming: str
    ticket: int | None
    """The acquire to answer when done; None once that caller left."""
    waited_since: float
    evict: tuple[str, ...]
    """Jobs that must be snapshotted (a preempted holder)."""
    candidates: tuple[str, ...]
    """Resident jobs, least recently used first, that may be evicted to make room."""
    restore: bool
    """Whether `incoming` is parked (or faulted) and must be restored."""
    epoch: int
    """Epoch every snapshot and restore of this attempt carries."""
    rollback_epoch: int
    """Epoch of the restores that undo a partial snapshot."""
    attempt: int
    started_at: float
    preempted: str | None = None
    """The holder this switch preempts, if any."""
    preempted_since: float = 0.0
    phase: str = ""
    detached: bool = False
    """A scheduler restart cut the incoming job's call off: the switch still ends in a grant
    to it (the job was served before the restart; its re-issued Acquire finds it holding),
    unless the call comes back first and takes `ticket` again."""
    purpose: SwitchKind = SwitchKind.GRANT
    """What the switch is for: a grant, a prefetch or an unprefetch (see `SwitchKind`)."""
    fence: tuple[str, ...] = ()
    """Jobs whose lease lapsed while they held the group (in `evict` too): snapshotted on
    every node before the grant, never rolled back; released once fenced."""


@dataclass(frozen=True, slots=True)
class GroupState:
    """Everything the scheduler knows about one group.

    Where jobs are placed is `placement` alone (build one from the views with
    `placement.place`); `resident`, `parked` and `faulted` only read it."""

    spec: GroupSpec
    jobs: Mapping[str, JobRecord] = field(default_factory=dict)
    holder: str | None = None
    holder_since: float = 0.0
    queue: tuple[Waiter, ...] = ()
    """Waiters in arrival order; the policy orders them when one is picked."""
    placement: PlacementMap = field(default_factory=lambda: EMPTY)
    """Job -> where its device state is (jobs never placed are IDLE, not in the map)."""
    epoch: int = 0
    switch: Switch | None = None
    yield_requested_at: float | None = None
    preempted: frozenset[str] = frozenset()
    """Jobs preempted while they believed they held; their next Yield is accepted."""
    switches: int = 0
    last_switch_seconds: float = 0.0
    last_switch_at: float = 0.0
    prefetched: tuple[str, ...] = ()
    """Resident jobs restored ahead of their grant and not granted since; parked again
    (unprefetch) if they stop waiting."""
    unfit: tuple[str, str] | None = None
    """(holder, waiter) for which a prefetch did not fit: not tried again for that pair."""
    fencing: tuple[str, ...] = ()
    """Jobs whose lease lapsed while they held (alive but unreachable, maybe still running):
    no one is granted the group until a switch has fenced them on every node."""
    acknowledged: tuple[str, int] | None = None
    """(holder, epoch) whose client was answered ALREADY_EXISTS for an Acquire it re-issued
    (it lost the grant's answer): that client knows it holds, so a late `LostGrant` for the
    same hold is ignored. Cleared when the hold ends."""

    @property
    def name(self) -> str:
        """The group id."""
        return self.spec.name

    @property
    def resident(self) -> tuple[str, ...]:
        """Jobs whose state is on the GPUs (holder included), least recently used first."""
        return self.placement.resident

    @property
    def parked(self) -> tuple[str, ...]:
        """Jobs whose state is in host DRAM, first parked first."""
        return self.placement.parked

    @property
    def faulted(self) -> Mapping[str, str]:
        """Job -> why its restore failed."""
        return self.placement.faulted

    def location(self, job: str) -> Location:
        """Where `job` stands."""
        if job == self.holder:
            return Location.HOLDING
        placed = self.placement.get(job)
        return Location.IDLE if placed is None else placed.where

    def known_jobs(self) -> frozenset[str]:
        """Every job whose state on the nodes this group still accounts for: registered,
        fenced, placed, or part of the switch in flight. An agent may drop the parked
        state of any other job once its processes are gone (its Release was lost)."""
        known = set(self.jobs) | set(self.fencing) | set(self.placement)
        if self.holder is not None:
            known.add(self.holder)
        if self.switch is not None:
            known.update((self.switch.incoming, *self.switch.evict, *self.switch.candidates))
        return frozenset(known)

    def waiter(self, job: str) -> Waiter | None:
        """The queued acquire of `job`, if any."""
        for waiter in self.queue:
            if waiter.job == job:
                return waiter
        return None

    def attached_waiters(self) -> int:
        """Waiters whose caller is connected."""
        return sum(1 for w in self.queue if w.attached)
