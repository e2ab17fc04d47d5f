"""Per-group runtime state kept beside the pure state: open calls, the lease timer, the
event ring and the busy window. asyncio objects live here, never in the core."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any

from rlslice.config import GroupSpec
from rlslice.scheduler.core import (
    GroupState,
    JobRecord,
    PlacementMap,
    Switch,
    SwitchKind,
    Waiter,
)
from rlslice.scheduler.core.placement import place

#: Seconds over which `busy_fraction` is measured.
BUSY_WINDOW_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class EventEntry:
    """One event of the ring; `state` is the group's state after the event's transition."""

    seq: int
    time: float
    group: str
    kind: str
    """A `core.actions.Kind` value, or "snapshot" for the first message of a Watch."""
    job: str
    detail: str
    seconds: float
    bytes: int
    state: GroupState


# Field order of the packed forms below: the slots order, which is each class's init order.
_JOB = attrgetter(*JobRecord.__slots__)
_WAITER = attrgetter(*Waiter.__slots__)
_JOB_WIDTH = len(JobRecord.__slots__)
_WAITER_WIDTH = len(Waiter.__slots__)
_SWITCH = attrgetter(*Switch.__slots__)
# A switch's purpose is packed as its value: an enum member is an object the collector
# tracks, and one would keep its whole entry tracked.
_PURPOSE_AT = Switch.__slots__.index("purpose")
# Every state field but the spec (which an entry names by version), in slots order: a new
# `GroupState` field is recorded as it is, unpacked in place. Those below are packed.
_STATE_FIELDS = GroupState.__slots__[1:]
_STATE = attrgetter(*_STATE_FIELDS)
_JOBS_AT = _STATE_FIELDS.index("jobs")
_QUEUE_AT = _STATE_FIELDS.index("queue")
_PLACEMENT_AT = _STATE_FIELDS.index("placement")
_SWITCH_AT = _STATE_FIELDS.index("switch")
_PREEMPTED_AT = _STATE_FIELDS.index("preempted")
#: Entry fields before the state's: seq, time, group, kind, job, detail, seconds, bytes,
#: spec version.
_HEAD = 9
_VERSION_AT = 8

#: One packed ring entry: the event's own fields, the spec's version in the ring, then the
#: state's fields other than the spec, with jobs, queue, placement, switch and preempted
#: packed.
Packed = tuple[Any, ...]


class EventRing:
    """A group's last `size` events, each with the group's state after it.

    Kept packed, as tuples of strings, numbers and such tuples only (no dict or set: the
    collector keeps any tuple holding one): the garbage collector untracks such tuples, so a full collection no longer walks every state in every ring (with 1,000 groups
    that was over 100 ms of stopped loop; see docs/benchmarks.md, `scale`). A spec is an
    object, so entries name it by a version number and the ring keeps the specs its entries
    use. Sub-values that did not change since the last entry (the jobs, the queue) are
    shared, as they are between states. Iterating unpacks: `EventEntry`s with states equal
    to the recorded ones.
    """

    __slots__ = (
        "_entries",
        "_jobs",
        "_jobs_packed",
        "_queue",
        "_queue_packed",
        "_records",
        "_spec",
        "_specs",
        "_version",
    )

    def __init__(self, size: int) -> None:
        self._entries: deque[Packed] = deque(maxlen=size)
        self._specs: dict[int, GroupSpec] = {}
        self._spec: GroupSpec | None = None
        self._version = 0
        self._jobs: Mapping[str, JobRecord] | None = None
        self._jobs_packed: tuple[Any, ...] = ()
        self._records: dict[str, tuple[JobRecord, tuple[Any, ...]]] = {}
        self._queue: tuple[Waiter, ...] = ()
        self._queue_packed: tuple[Any, ...] = ()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[EventEntry]:
        specs = self._specs
        for packed in list(self._entries):
            yield _unpack(packed, specs)

    def append(self, entry: EventEntry) -> None:
        """Keep `entry` (the oldest one goes once the ring is full)."""
        e = entry
        self.add(e.seq, e.time, e.kind, e.job, e.detail, e.seconds, e.bytes, e.state)

    def add(
        self,
        seq: int,
        time: float,
        kind: str,
        job: str,
        detail: str,
        seconds: float,
        nbytes: int,
        state: GroupState,
    ) -> None:
        """`append` without building the `EventEntry` first (the engine's hot path)."""
        if state.spec is not self._spec:
            self._version += 1
            self._spec = state.spec
            self._specs[self._version] = state.spec
        if state.jobs is not self._jobs:
            self._jobs = state.jobs
            self._jobs_packed = self._pack_jobs(state.jobs)
        if state.queue is not self._queue:
            self._queue = state.queue
            self._queue_packed = tuple(chain.from_iterable(map(_WAITER, state.queue)))
        values = list(_STATE(state))
        values[_JOBS_AT] = self._jobs_packed
        values[_QUEUE_AT] = self._queue_packed
        values[_PLACEMENT_AT] = _pack_placement(state.placement)
        switch = state.switch
        values[_SWITCH_AT] = None if switch is None else _pack_switch(switch)
        preempted = state.preempted
        values[_PREEMPTED_AT] = tuple(sorted(preempted)) if preempted else ()
        entries = self._entries
        entries.append(
            (seq, time, state.spec.name, kind, job, detail, seconds, nbytes, self._version, *values)
        )
        oldest = entries[0][_VERSION_AT]
        if len(self._specs) > 1 and oldest > min(self._specs):
            for version in [v for v in self._specs if v < oldest]:
                del self._specs[version]

    def _pack_jobs(self, jobs: Mapping[str, JobRecord]) -> tuple[Any, ...]:
        """Pack the records, reusing the packed form of each record that did not change
        (a keep-alive or a hold's end replaces one record of the group)."""
        old = self._records
        new: dict[str, tuple[JobRecord, tuple[Any, ...]]] = {}
        for name, record in jobs.items():
            hit = old.get(name)
            new[name] = hit if hit is not None and hit[0] is record else (record, _JOB(record))
        self._records = new
        # Flat (record after record): an entry is then at most two tuples deep, so two
        # collections untrack it whatever order the collector meets its parts in.
        return tuple(chain.from_iterable(packed for _, packed in new.values()))


def _chunks(flat: tuple[Any, ...], width: int) -> Iterator[tuple[Any, ...]]:
    return (flat[i : i + width] for i in range(0, len(flat), width))


def _pack_switch(switch: Switch) -> tuple[Any, ...]:
    packed = _SWITCH(switch)
    at = _PURPOSE_AT
    return (*packed[:at], switch.purpose.value, *packed[at + 1 :])


def _pack_placement(placement: PlacementMap) -> tuple[Any, ...]:
    """The three views, faulted flattened (job, reason, job, ...): two tuples deep."""
    faulted = placement.faulted
    flat = tuple(chain.from_iterable(faulted.items())) if faulted else ()
    return (placement.resident, placement.parked, flat)


def _unpack(p: Packed, specs: Mapping[int, GroupSpec]) -> EventEntry:
    values = list(p[_HEAD:])
    values[_JOBS_AT] = {j[0]: JobRecord(*j) for j in _chunks(values[_JOBS_AT], _JOB_WIDTH)}
    values[_QUEUE_AT] = tuple(Waiter(*w) for w in _chunks(values[_QUEUE_AT], _WAITER_WIDTH))
    resident, parked, faulted = values[_PLACEMENT_AT]
    values[_PLACEMENT_AT] = place(resident, parked, dict(_chunks(faulted, 2)))
    switch = values[_SWITCH_AT]
    if switch is not None:
        fields = list(switch)
        fields[_PURPOSE_AT] = SwitchKind(fields[_PURPOSE_AT])
        values[_SWITCH_AT] = Switch(*fields)
    values[_PREEMPTED_AT] = frozenset(values[_PREEMPTED_AT])
    state = GroupState(specs[p[_VERSION_AT]], *values)
    return EventEntry(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], state)


class BusyWindow:
    """Which part of the last minute the group was held.

    A status (every GetGroup, every event sent to a watcher) asks for the fraction, and a
    busy group closes hundreds of holds a minute: the sum of the closed holds is kept as
    they come and go, so a question walks only the holds that straddle the window's ends,
    not the whole minute."""

    __slots__ = ("_closed", "_total")

    def __init__(self) -> None:
        self._closed: deque[tuple[float, float]] = deque()
        self._total = 0.0
        """The summed length of the holds in `_closed`."""

    def add(self, start: float, end: float) -> None:
        self._closed.append((start, end))
        self._total += end - start
        while self._closed and self._closed[0][1] < end - BUSY_WINDOW_SECONDS:
            s, e = self._closed.popleft()
            self._total -= e - s
        if not self._closed:
            self._total = 0.0  # no rounding left over from the sums

    def fraction(self, now: float, holding_since: float | None) -> float:
        """Busy fraction of [now - window, now], counting a hold still open."""
        start = now - BUSY_WINDOW_SECONDS
        busy = self._total
        for s, e in self._closed:  # oldest first: take off what lies before the window
            if s >= start:
                break
            busy -= min(e, start) - s
        for s, e in reversed(self._closed):  # newest first: and what lies after `now`
            if e <= now:
                break
            busy -= e - max(s, now, start)
        if holding_since is not None:
            busy += max(0.0, now - max(holding_since, start))
        return min(1.0, max(0.0, busy) / BUSY_WINDOW_SECONDS)


@dataclass(eq=False)
class GroupRuntime:
    """One group: its current state and the asyncio bits that serve it."""

    state: GroupState
    ring: EventRing
    calls: dict[int, asyncio.Future[object]] = field(default_factory=dict)
    """Open acquires by ticket."""
    timer: asyncio.TimerHandle | None = None
    timer_at: float | None = None
    busy: BusyWindow = field(default_factory=BusyWindow)
    watchers: set[asyncio.Queue[EventEntry | None]] = field(default_factory=set)
    switch_task: asyncio.Task[None] | None = None
    commits: set[asyncio.Task[None]] = field(default_factory=set)
    """Store writes under way whose grants and switches take effect once they land
    (`Engine._commit_then`): a switch held there has no `switch_task` yet."""
