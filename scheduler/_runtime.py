"""Per-group runtime state kept beside the pure state: open calls, the lease timer, the
event ring and the busy window. asyncio objects live here, never in the core."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from rlslice.scheduler.core import GroupState

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


class BusyWindow:
    """Which part of the last minute the group was held."""

    __slots__ = ("_closed",)

    def __init__(self) -> None:
        self._closed: deque[tuple[float, float]] = deque()

    def add(self, start: float, end: float) -> None:
        self._closed.append((start, end))
        while self._closed and self._closed[0][1] < end - BUSY_WINDOW_SECONDS:
            self._closed.popleft()

    def fraction(self, now: float, holding_since: float | None) -> float:
        """Busy fraction of [now - window, now], counting a hold still open."""
        start = now - BUSY_WINDOW_SECONDS
        busy = sum(max(0.0, min(e, now) - max(s, start)) for s, e in self._closed)
        if holding_since is not None:
            busy += max(0.0, now - max(holding_since, start))
        return min(1.0, busy / BUSY_WINDOW_SECONDS)


@dataclass(eq=False)
class GroupRuntime:
    """One group: its current state and the asyncio bits that serve it."""

    state: GroupState
    ring: deque[EventEntry]
    calls: dict[int, asyncio.Future[object]] = field(default_factory=dict)
    """Open acquires by ticket."""
    timer: asyncio.TimerHandle | None = None
    timer_at: float | None = None
    busy: BusyWindow = field(default_factory=BusyWindow)
    watchers: set[asyncio.Queue[EventEntry | None]] = field(default_factory=set)
    switch_task: asyncio.Task[None] | None = None
