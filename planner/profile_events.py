"""Phase profiles from a scheduler's events: holds, gaps and switches into profiles. Pure.

`profiles_from_events` folds one group's events (`Watch` messages or a recorded
`rlslice timeline --save-log` file, as plain event values) into one
`rlslice.planner.profile.WorkloadProfile` per job; the table of what is measured from
which events is in `rlslice.planner.profile`'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal, Protocol

from rlslice.planner.profile import (
    DIGITS,
    MIN_PHASE_SECONDS,
    Percentiles,
    ProfiledPhase,
    SwitchMeasurements,
    WorkloadProfile,
)
from rlslice.planner.stats import percentile


class EventLike(Protocol):
    """The fields of a scheduler event the profiler reads (`rlslice.apps.timeline.trace_export.Event`)."""

    @property
    def time(self) -> float: ...
    @property
    def kind(self) -> str: ...
    @property
    def job(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def bytes(self) -> int: ...
    @property
    def detail(self) -> str: ...


_HOLD_ENDS = frozenset({"YIELDED", "PREEMPTED", "UNREGISTERED", "LEASE_EXPIRED", "FAULTED"})


class _Hold:
    __slots__ = ("asked", "end", "phase", "start")

    def __init__(self, phase: str, asked: float, start: float) -> None:
        self.phase, self.asked, self.start = phase, asked, start
        self.end: float | None = None


class _Trace:
    """One group's events folded into each job's holds and the group's switches."""

    def __init__(self, events: Iterable[EventLike]) -> None:
        ordered = sorted(events, key=lambda e: (e.time, getattr(e, "seq", 0)))
        self.start = ordered[0].time if ordered else 0.0
        self.end = ordered[-1].time if ordered else 0.0
        self.holds: dict[str, list[_Hold]] = {}
        self.switch_seconds: dict[str, list[float]] = {}
        self.switch_bytes: dict[str, list[tuple[int, int]]] = {}  # moved, jobs sharing it
        self.state_shares: dict[str, list[float]] = {}
        self.handoffs: dict[str, list[float]] = {}
        asked: dict[str, float] = {}
        holder: str | None = None
        freed_at: float | None = None  # the last hold's end
        started: tuple[float, str] | None = None
        switch_end: dict[str, float] = {}
        lead: dict[str, float] = {}
        for event in ordered:
            kind, job, now = event.kind, event.job, event.time
            if kind == "QUEUED" and job:
                asked.setdefault(job, now)
            elif kind == "GRANTED" and job:
                self.holds.setdefault(job, []).append(_Hold(event.detail, asked.pop(job, now), now))
                if job in switch_end:
                    self.handoffs.setdefault(job, []).append(
                        lead.pop(job, 0.0) + max(0.0, now - switch_end.pop(job))
                    )
                holder, freed_at = job, None
            elif kind in _HOLD_ENDS and job:
                hold = self.holds.get(job, [])
                if hold and hold[-1].end is None:
                    hold[-1].end = now
                    if holder == job:
                        holder, freed_at = None, now
                if kind != "YIELDED":
                    asked.pop(job, None)
            elif kind == "SWITCH_STARTED" and job:
                wanted = max(asked.get(job, now), freed_at if freed_at is not None else now)
                lead[job] = max(0.0, now - wanted) if holder is None else 0.0
                started = (now, event.detail)
            elif kind == "SWITCH_DONE" and job:
                self.switch_seconds.setdefault(job, []).append(event.seconds)
                displaced = _evicted(started[1] if started else "") or (
                    [self._last_other(job)] if self._last_other(job) else []
                )
                share = event.bytes / (1 + len(displaced))
                for who in (job, *displaced):
                    self.state_shares.setdefault(who, []).append(share)
                self.switch_bytes.setdefault(job, []).append((event.bytes, 1 + len(displaced)))
                switch_end[job] = now
                started = None
        for holds in self.holds.values():
            if holds and holds[-1].end is None:
                holds.pop()  # still open at the end of the recording

    def _last_other(self, job: str) -> str:
        """The job that held the group most recently before `job` asked (the one displaced)."""
        best, when = "", -math.inf
        for other, holds in self.holds.items():
            if other != job and holds and holds[-1].start > when:
                best, when = other, holds[-1].start
        return best


def _evicted(detail: str) -> list[str]:
    for part in detail.split(";"):
        part = part.strip()
        if part.startswith("evict "):
            return [name.strip() for name in part.removeprefix("evict ").split(",") if name.strip()]
    return []


def _period(names: Sequence[str]) -> int:
    """The shortest p for which the sequence repeats with period p (mostly; 1 at worst)."""
    for p in range(1, min(8, max(1, len(names) // 2)) + 1):
        pairs = len(names) - p
        if pairs <= 0:
            break
        same = sum(names[i] == names[i + p] for i in range(pairs))
        if same >= 0.9 * pairs:
            return p
    return max(1, len(set(names)))


def _job_profile(
    trace: _Trace, job: str, *, source: str, state_bytes: int | None, max_slowdown: float | None
) -> WorkloadProfile | None:
    holds = [h for h in trace.holds.get(job, []) if h.end is not None]
    counts: dict[str, int] = {}
    for hold in holds:
        counts[hold.phase] = counts.get(hold.phase, 0) + 1
    common = max(counts.values(), default=0)
    # One-off phases (loading the model) are not part of the cycle.
    steady = [i for i, h in enumerate(holds) if counts[h.phase] > 1 or common <= 1]
    if not steady:
        return None
    names = [holds[i].phase for i in steady]
    period = _period(names)
    first = steady[0]
    # The cycle starts at the first steady phase; gaps after a hold run to the next ask.
    holds_by_slot: list[list[float]] = [[] for _ in range(period)]
    gaps_by_slot: list[list[float]] = [[] for _ in range(period)]
    for position, index in enumerate(steady):
        hold = holds[index]
        assert hold.end is not None
        slot = position % period
        holds_by_slot[slot].append(hold.end - hold.start)
        if position + 1 < len(steady) and steady[position + 1] == index + 1:
            gaps_by_slot[slot].append(max(0.0, holds[index + 1].asked - hold.end))
    phases: list[ProfiledPhase] = []
    for slot in range(period):
        name = holds[first + slot].phase or "gpu"
        stats = Percentiles.of(holds_by_slot[slot])
        phases.append(_phase(_label(name, "gpu", phases), "gpu", stats))
        if gaps_by_slot[slot]:
            gap = Percentiles.of(gaps_by_slot[slot])
            phases.append(_phase(_label(f"after-{name}", "cpu", phases), "cpu", gap))
    cycle_times = [
        holds[steady[k + period]].start - holds[steady[k]].start
        for k in range(0, len(steady) - period, period)
        if steady[k + period] == steady[k] + period
    ]
    shares = trace.state_shares.get(job, [])
    measured = SwitchMeasurements(
        switches=len(trace.switch_seconds.get(job, [])),
        moved_bytes=sum(b for b, _ in trace.switch_bytes.get(job, [])),
        switch_seconds=_maybe(trace.switch_seconds.get(job, [])),
        bandwidth_bytes_per_s=_rate(trace.switch_bytes.get(job, []), trace.switch_seconds.get(job)),
        handoff_seconds=_maybe(trace.handoffs.get(job, [])),
    )
    return WorkloadProfile(
        name=job,
        phases=tuple(phases),
        state_bytes=state_bytes if state_bytes is not None else round(_median(shares)),
        max_slowdown=max_slowdown,
        source=source,
        window_seconds=round(trace.end - trace.start, DIGITS),
        cycles=len(cycle_times),
        cycle_seconds_measured=_maybe(cycle_times),
        switching=measured,
    )


def _label(name: str, kind: str, phases: Sequence[ProfiledPhase]) -> str:
    taken = {p.name for p in phases}
    label, n = name[:60], 2
    while label in taken:
        label, n = f"{name[:57]}-{n}", n + 1
    return label


def _phase(name: str, kind: Literal["gpu", "cpu"], stats: Percentiles) -> ProfiledPhase:
    return ProfiledPhase(
        name=name,
        kind=kind,
        seconds=max(MIN_PHASE_SECONDS, stats.p50),
        jitter=stats.jitter,
        stats=stats,
    )


def _maybe(values: Sequence[float] | None) -> Percentiles | None:
    return Percentiles.of(values) if values else None


def _median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def _rate(moved: Sequence[tuple[int, int]], seconds: Sequence[float] | None) -> float | None:
    total_s = sum(seconds or ())
    total_b = sum(b for b, _ in moved)
    return round(total_b / total_s) if total_s > 0 and total_b > 0 else None


def profiles_from_events(
    events: Iterable[EventLike],
    *,
    jobs: Sequence[str] = (),
    source: str = "events",
    state_bytes: int | None = None,
    max_slowdown: float | None = None,
) -> tuple[WorkloadProfile, ...]:
    """One profile per job seen holding the group (or only `jobs`), from one group's events.

    `state_bytes` overrides the estimate from the switches (a dedicated run has none: then
    the estimate is 0 and the caller should say how big the state is).
    """
    trace = _Trace(events)
    wanted = list(jobs) or list(trace.holds)
    out = []
    for job in wanted:
        profile = _job_profile(
            trace, job, source=source, state_bytes=state_bytes, max_slowdown=max_slowdown
        )
        if profile is not None:
            out.append(profile)
    return tuple(out)


__all__ = ["EventLike", "profiles_from_events"]
