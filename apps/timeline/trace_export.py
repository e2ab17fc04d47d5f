"""Scheduler events -> timeline lanes -> Chrome trace JSON. Pure: no grpc, no protobuf.

The scheduler keeps a bounded ring of each group's events (`GetEvents`). This module turns
that list into what a person wants to see: when each job held the group (and for which
phase), when it waited, when the group switched and what moved. `rlslice timeline` draws the
same `Timeline` as a PNG and writes it as a Chrome trace (opens in Perfetto and
chrome://tracing).

Input is plain data: `Event` values, built from the proto JSON form of `GetEventsResponse`
(`events_from_json`, what `rlslice timeline --save-log` writes) or, in `rlslice.apps.timeline.command`,
from the protobuf messages.

How events become intervals (times are Unix seconds):

| lane | interval | from | to |
|---|---|---|---|
| job | `held` (named by the phase) | GRANTED(job) | YIELDED, PREEMPTED, LEASE_EXPIRED, UNREGISTERED, FAULTED, FAILED of the job, a GRANTED of another job, GROUP_DELETED |
| job | `waiting` | QUEUED(job) | GRANTED, CANCELLED, FAILED, FAULTED, LEASE_EXPIRED, UNREGISTERED of the job, GROUP_DELETED |
| `[switch]` | `switch -> job` (`switch job-a (parked p3; discarded p0) -> job` after a partial move) | SWITCH_STARTED | SWITCH_DONE / SWITCH_FAILED (or `time - seconds` when the start fell out of the ring) |
| `[moves]` | `snapshot job` / `restore job` (`snapshot job (parked p3; discarded p0)` after a partial snapshot) | `time - seconds` | SNAPSHOT_DONE / RESTORE_DONE |
| `[spill]` | `spill job` / `fill job` (host memory to disk, disk to host memory) | `time - seconds` | SPILL_DONE / FILL_DONE |

An interval still open at the end of the log ends at the last event and says `open`. A wait
of zero length (an uncontended acquire, QUEUED and GRANTED at the same instant) is left out.
Intervals that would overlap within one lane spill into a numbered lane (`[moves] #2`), so
no lane ever holds two overlapping intervals (a Chrome trace needs proper nesting).
Yields, preemptions, faults, lease expiries, cancellations and failures are instants.

Which parts of a job are parked (issue 26): after a partial switch, the status that comes
with each event (`GroupEvent.status`) lists, per partly parked job, the tags in host memory
(`parked_parts`) and the discard parts freed and not yet told to the job (`discarded_parts`);
`Event.parts` keeps those lists. A snapshot slice names its job's parts; a switch slice
names the parts of the jobs it snapshotted (the outgoing jobs: SNAPSHOT_DONE events since
the switch started, or since the last switch when its start fell out of the ring), and each
such job's lane gets an instant at the switch's end, both named in `rlslice status`'s
wording (`parked p3; discarded p0`, `rlslice.apps.shared.parts`) and with args
`{"parked_parts": "p3", "discarded_parts": "p0"}` (an empty list is left out; a switch that
parked several jobs partly gives each tag list as `job-a: p3; job-c: p1`). A job moved
whole lists no parts: its slices show as they always did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlslice.apps.shared.parts import job_with_parts, parts_words

#: The lanes of switch intervals and of snapshot/restore intervals. Brackets cannot occur in
#: a job id (a DNS-1123 label), so a job named "switch" gets a lane of its own.
SWITCH_LANE = "[switch]"
MOVES_LANE = "[moves]"
SPILL_LANE = "[spill]"
"""The agents' moves of parked bytes between host memory and their disk tier."""

_HELD_ENDS = frozenset(
    {"YIELDED", "PREEMPTED", "LEASE_EXPIRED", "UNREGISTERED", "FAULTED", "FAILED"}
)
_WAIT_ENDS = frozenset(
    {"GRANTED", "CANCELLED", "FAILED", "FAULTED", "LEASE_EXPIRED", "UNREGISTERED"}
)
#: Move events -> (lane, interval category).
_MOVE_KINDS = {
    "SNAPSHOT_DONE": (MOVES_LANE, "snapshot"),
    "RESTORE_DONE": (MOVES_LANE, "restore"),
    "SPILL_DONE": (SPILL_LANE, "spill"),
    "FILL_DONE": (SPILL_LANE, "fill"),
}
#: Event kinds drawn as instants on the job's lane (or the switch lane).
INSTANT_KINDS = frozenset(
    {
        "YIELDED",
        "YIELD_REQUESTED",
        "PREEMPTED",
        "FAULTED",
        "LEASE_EXPIRED",
        "CANCELLED",
        "FAILED",
        "SWITCH_FAILED",
    }
)


@dataclass(frozen=True)
class JobParts:
    """One partly parked job's parts, as the status after an event lists them."""

    job: str
    parked: tuple[str, ...] = ()
    """Tags in host memory (`JobStatus.parked_parts`); the rest stayed on the device."""
    discarded: tuple[str, ...] = ()
    """Tags of discard parts freed, not yet told to the job (`JobStatus.discarded_parts`)."""

    def words(self) -> str:
        """`parked p3; discarded p0` (`rlslice status`'s wording)."""
        return parts_words(self.parked, self.discarded)

    def args(self) -> dict[str, str]:
        """`{"parked_parts": "p3", "discarded_parts": "p0"}`, empty lists left out."""
        named = (("parked_parts", self.parked), ("discarded_parts", self.discarded))
        return {key: " ".join(tags) for key, tags in named if tags}


@dataclass(frozen=True)
class Event:
    """One scheduler event, as plain data: the fields of `GroupEvent`, and of its `status`
    only the parts of the partly parked jobs (`parts`)."""

    time: float
    """Unix time of the event."""
    group: str
    kind: str
    """The `EventKind` name without its `EVENT_KIND_` prefix: "GRANTED", "SWITCH_DONE"."""
    job: str = ""
    epoch: int = 0
    seconds: float = 0.0
    """Seconds (switch, snapshot, restore, wait), where they apply."""
    bytes: int = 0
    """Bytes moved, where they apply."""
    detail: str = ""
    """A phase name or a failure reason."""
    seq: int = 0
    parts: tuple[JobParts, ...] = ()
    """The jobs whose parts the status after the event lists (parked or discarded tags),
    in the status's order; jobs parked whole or on the GPUs are not listed."""

    def parts_of(self, job: str) -> JobParts | None:
        """`job`'s parts in the status after this event, or None when none are listed."""
        return next((p for p in self.parts if p.job == job), None)


@dataclass(frozen=True)
class Interval:
    """A span of time on one lane."""

    lane: str
    name: str
    category: str
    """"held", "waiting", "switch", "snapshot", "restore", "spill" or "fill"."""
    start: float
    end: float
    args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Instant:
    """A point event on one lane (a yield, a fault)."""

    lane: str
    name: str
    time: float
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Timeline:
    """A group's history as lanes of non-overlapping intervals plus instants."""

    group: str
    start: float
    end: float
    lanes: tuple[str, ...]
    """Lane names in display order: switch lanes first, then jobs in order of appearance."""
    intervals: tuple[Interval, ...]
    instants: tuple[Instant, ...]


def normalise_kind(kind: str | int) -> str:
    """`EVENT_KIND_GRANTED` or `GRANTED` -> `GRANTED`."""
    text = str(kind)
    return text.removeprefix("EVENT_KIND_")


def event_from_dict(data: Mapping[str, Any]) -> Event:
    """An `Event` from the proto JSON form of a `GroupEvent` (int64 fields may be strings)."""
    return Event(
        time=float(data.get("time", 0.0)),
        group=str(data.get("group", "")),
        kind=normalise_kind(data.get("kind", "UNSPECIFIED")),
        job=str(data.get("job", "")),
        epoch=int(data.get("epoch", 0)),
        seconds=float(data.get("seconds", 0.0)),
        bytes=int(data.get("bytes", 0)),
        detail=str(data.get("detail", "")),
        seq=int(data.get("seq", 0)),
        parts=_parts_from_status(data.get("status")),
    )


def _parts_from_status(status: Any) -> tuple[JobParts, ...]:
    """The parts a `GroupStatus` in JSON form lists (proto field names or their camelCase
    JSON names, as `MessageToJson` writes them)."""
    if not isinstance(status, Mapping):
        return ()
    found = []
    for job in status.get("jobs", ()):
        if not isinstance(job, Mapping):
            continue
        parked = tuple(str(t) for t in job.get("parked_parts", job.get("parkedParts", ())))
        discarded = tuple(str(t) for t in job.get("discarded_parts", job.get("discardedParts", ())))
        if parked or discarded:
            found.append(JobParts(str(job.get("job", "")), parked, discarded))
    return tuple(found)


def events_from_json(data: Any) -> list[Event]:
    """Events from a JSON document: `{"events": [...]}` (a `GetEventsResponse`) or a list.

    Raises ValueError naming what is wrong when the document has neither shape.
    """
    items = data.get("events", []) if isinstance(data, Mapping) else data
    if not isinstance(items, list):
        raise ValueError("events: expected a list of events or an object with 'events'")
    events = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValueError(f"events[{index}]: expected an object")
        events.append(event_from_dict(item))
    return events


def event_to_dict(event: Event) -> dict[str, Any]:
    """The proto JSON form of `event` (what `events_from_json` reads back); its `status`
    holds only the jobs' parts, when there are any."""
    document: dict[str, Any] = {
        "time": event.time,
        "group": event.group,
        "kind": f"EVENT_KIND_{event.kind}",
        "job": event.job,
        "epoch": str(event.epoch),
        "seconds": event.seconds,
        "bytes": str(event.bytes),
        "detail": event.detail,
        "seq": str(event.seq),
    }
    if event.parts:
        document["status"] = {
            "jobs": [
                {"job": p.job, "parked_parts": list(p.parked), "discarded_parts": list(p.discarded)}
                for p in event.parts
            ]
        }
    return document


def build_timeline(events: Iterable[Event], group: str = "") -> Timeline:
    """Fold events (any order; sorted by time, then seq) into a `Timeline`.

    `group` keeps only that group's events; empty keeps all (and names the timeline after
    the first event's group).
    """
    ordered = sorted(
        (e for e in events if not group or e.group == group), key=lambda e: (e.time, e.seq)
    )
    name = group or (ordered[0].group if ordered else "")
    if not ordered:
        return Timeline(name, 0.0, 0.0, (), (), ())
    start, end = ordered[0].time, ordered[-1].time
    fold = _Fold(start)
    for event in ordered:
        fold.feed(event)
    fold.finish(end)
    intervals = _spill(fold.raw)
    base = [SWITCH_LANE, MOVES_LANE, SPILL_LANE, *fold.jobs]
    used = {i.lane for i in intervals} | {i.lane for i in fold.instants}
    lanes = [lane for lane in _ordered_lanes(base, used) if lane in used]
    return Timeline(name, start, end, tuple(lanes), tuple(intervals), tuple(fold.instants))


@dataclass
class _Fold:
    """The open holds, waits and switch while events are folded into intervals."""

    start: float
    jobs: list[str] = field(default_factory=list)
    raw: list[Interval] = field(default_factory=list)
    instants: list[Instant] = field(default_factory=list)
    holding: dict[str, tuple[float, str, int]] = field(default_factory=dict)
    """job -> (since, phase, epoch)"""
    waiting: dict[str, tuple[float, str]] = field(default_factory=dict)
    """job -> (since, phase)"""
    switch_open: tuple[float, Event] | None = None
    outgoing: list[str] = field(default_factory=list)
    """Jobs snapshotted since the last switch started or ended (the switch's outgoing jobs)."""

    def feed(self, event: Event) -> None:
        kind, job, t = event.kind, event.job, event.time
        if job and job not in self.jobs:
            self.jobs.append(job)
        if kind == "QUEUED" and job:
            self.waiting.setdefault(job, (t, event.detail))
        elif kind == "GRANTED" and job:
            self._granted(event)
        elif kind == "SWITCH_STARTED":
            self.switch_open = (t, event)
            self.outgoing.clear()
        elif kind == "PREFETCH":  # a side switch's moves are not the next switch's
            self.outgoing.clear()
        elif kind in ("SWITCH_DONE", "SWITCH_FAILED"):
            self._switch_ended(event)
        elif kind in _MOVE_KINDS:
            self._moved(event)
        elif kind == "GROUP_DELETED":
            for other in list(self.holding):
                self.close_held(other, t, kind)
            for other in list(self.waiting):
                self.close_wait(other, t, kind)
        if job and kind in _HELD_ENDS and job in self.holding:
            self.close_held(job, t, kind)
        if job and kind in _WAIT_ENDS and job in self.waiting and kind != "GRANTED":
            self.close_wait(job, t, kind)
        if kind in INSTANT_KINDS:
            args: dict[str, Any] = {"epoch": event.epoch}
            if event.detail:
                args["detail"] = event.detail
            self.instants.append(Instant(job if job else SWITCH_LANE, kind.lower(), t, args))

    def _granted(self, event: Event) -> None:
        job, t = event.job, event.time
        for other in [j for j in self.holding if j != job]:
            self.close_held(other, t, f"granted to {job}")
        phase = event.detail
        if job in self.waiting:
            phase = phase or self.waiting[job][1]
            self.close_wait(job, t, "GRANTED")
        if job not in self.holding:
            self.holding[job] = (t, phase, event.epoch)

    def _switch_ended(self, event: Event) -> None:
        opened = self.switch_open
        began = opened[0] if opened else max(self.start, event.time - event.seconds)
        incoming = event.job or (opened[1].job if opened else "")
        outcome = "done" if event.kind == "SWITCH_DONE" else "failed"
        parts = [p for p in map(event.parts_of, self.outgoing) if p is not None]
        name = "switch"
        if parts:
            name += " " + ", ".join(job_with_parts(p.job, p.parked, p.discarded) for p in parts)
        if incoming:
            name += f" -> {incoming}"
        args = _moved_args(event, outcome=outcome)
        args.update(_switch_parts_args(parts))
        self.raw.append(Interval(SWITCH_LANE, name, "switch", began, event.time, args))
        for part in parts:
            self.instants.append(
                Instant(part.job, part.words(), event.time, {"epoch": event.epoch, **part.args()})
            )
        self.switch_open = None
        self.outgoing.clear()

    def _moved(self, event: Event) -> None:
        lane, verb = _MOVE_KINDS[event.kind]
        name = f"{verb} {event.job}".strip()
        args = _moved_args(event, node=event.detail)
        if event.kind == "SNAPSHOT_DONE" and event.job:
            if event.job not in self.outgoing:
                self.outgoing.append(event.job)
            part = event.parts_of(event.job)
            if part is not None:
                name = f"{verb} {job_with_parts(part.job, part.parked, part.discarded)}"
                args.update(part.args())
        self.raw.append(
            Interval(
                lane, name, verb, max(self.start, event.time - event.seconds), event.time, args
            )
        )

    def close_held(self, job: str, at: float, why: str) -> None:
        since, phase, epoch = self.holding.pop(job)
        self.raw.append(
            Interval(job, phase or "held", "held", since, at, {"epoch": epoch, "ended_by": why})
        )

    def close_wait(self, job: str, at: float, why: str) -> None:
        since, phase = self.waiting.pop(job)
        if at <= since:  # an uncontended acquire: QUEUED and GRANTED in the same instant
            return
        self.raw.append(
            Interval(job, "waiting", "waiting", since, at, {"phase": phase, "ended_by": why})
        )

    def finish(self, end: float) -> None:
        """Close what is still open at `end`."""
        for job in list(self.holding):
            self.close_held(job, end, "open")
        for job in list(self.waiting):
            self.close_wait(job, end, "open")
        if self.switch_open is not None:
            self.raw.append(
                Interval(
                    SWITCH_LANE, "switch", "switch", self.switch_open[0], end, {"ended_by": "open"}
                )
            )


def _moved_args(event: Event, **extra: str) -> dict[str, Any]:
    args: dict[str, Any] = {"seconds": event.seconds, "bytes": event.bytes, "epoch": event.epoch}
    if event.seconds > 0 and event.bytes:
        args["gb_per_s"] = round(event.bytes / event.seconds / 1e9, 3)
    args.update({k: v for k, v in extra.items() if v})
    return args


def _switch_parts_args(parts: Sequence[JobParts]) -> dict[str, str]:
    """The parts a switch parked: one job's tags as they are (`{"parked_parts": "p3"}`),
    several jobs' prefixed by the job (`job-a: p3; job-c: p1`)."""
    if len(parts) == 1:
        return parts[0].args()
    merged: dict[str, list[str]] = {}
    for part in parts:
        for key, tags in part.args().items():
            merged.setdefault(key, []).append(f"{part.job}: {tags}")
    return {key: "; ".join(each) for key, each in merged.items()}


def _spill(intervals: Sequence[Interval]) -> list[Interval]:
    """Move intervals that overlap an earlier one of their lane into `lane #2`, `#3`, ..."""
    ends: dict[str, list[float]] = {}  # base lane -> end of the last interval per sub-lane
    out: list[Interval] = []
    for interval in sorted(intervals, key=lambda i: (i.start, i.end)):
        subs = ends.setdefault(interval.lane, [])
        for index, last_end in enumerate(subs):
            if interval.start >= last_end:
                subs[index] = interval.end
                break
        else:
            index = len(subs)
            subs.append(interval.end)
        lane = interval.lane if index == 0 else f"{interval.lane} #{index + 1}"
        out.append(
            interval
            if index == 0
            else Interval(
                lane, interval.name, interval.category, interval.start, interval.end, interval.args
            )
        )
    return out


def _ordered_lanes(base: Sequence[str], used: set[str]) -> list[str]:
    order: list[str] = []
    for lane in base:
        order.append(lane)
        spilled = sorted(
            (u for u in used if u.startswith(f"{lane} #")), key=lambda u: int(u.rsplit("#", 1)[1])
        )
        order.extend(spilled)
    return order


def chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """The Chrome trace (JSON object format) of `timeline`.

    One process (the group), one thread per lane in display order; `ts`/`dur` in
    microseconds from the first event; `otherData.start_unix` keeps the absolute origin.
    """
    origin = timeline.start
    tids = {lane: index + 1 for index, lane in enumerate(timeline.lanes)}
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": timeline.group}}
    ]
    for lane, tid in tids.items():
        events.append(
            {"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": lane}}
        )
        events.append(
            {
                "ph": "M",
                "pid": 1,
                "tid": tid,
                "name": "thread_sort_index",
                "args": {"sort_index": tid},
            }
        )
    for interval in timeline.intervals:
        events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": tids[interval.lane],
                "name": interval.name,
                "cat": interval.category,
                "ts": _micros(interval.start - origin),
                "dur": _micros(interval.end - interval.start),
                "args": dict(interval.args),
            }
        )
    for instant in timeline.instants:
        events.append(
            {
                "ph": "i",
                "s": "t",
                "pid": 1,
                "tid": tids[instant.lane],
                "name": instant.name,
                "cat": "event",
                "ts": _micros(instant.time - origin),
                "args": dict(instant.args),
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"group": timeline.group, "start_unix": origin, "end_unix": timeline.end},
    }


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def busy_seconds(timeline: Timeline) -> dict[str, float]:
    """Seconds each job held the group over the timeline (its `held` intervals)."""
    totals: dict[str, float] = {}
    for interval in timeline.intervals:
        if interval.category == "held":
            job = interval.lane.split(" #", 1)[0]
            totals[job] = totals.get(job, 0.0) + interval.seconds
    return totals


#: Planner interval kinds for each interval category (`rlslice.planner.plot_timeline`).
_PLOT_KINDS = {"held": "gpu", "waiting": "wait", "snapshot": "snapshot", "restore": "restore"}


def plot_lanes(
    timeline: Timeline,
) -> tuple[list[tuple[str, float, float, str]], list[tuple[float, float]]]:
    """The timeline as the planner's plotter takes it: `(lane, start, end, kind)` intervals
    in lane order, seconds from the first event (held -> `gpu:<phase>`, waiting -> `wait`;
    failed switches -> lane `[switch failed]`), and `(start, end)` of the switches that
    completed."""
    origin = timeline.start
    order = {lane: index for index, lane in enumerate(timeline.lanes)}
    lanes: list[tuple[str, float, float, str]] = []
    switches: list[tuple[float, float]] = []
    for interval in sorted(timeline.intervals, key=lambda i: (order[i.lane], i.start)):
        start, end = interval.start - origin, interval.end - origin
        if interval.category == "switch":
            if interval.args.get("outcome") == "failed":
                lanes.append(("[switch failed]", start, end, "failed"))
            else:
                switches.append((start, end))
            continue
        kind = _PLOT_KINDS.get(interval.category, interval.category)
        if interval.category == "held":
            kind = f"gpu:{interval.name}"
        lanes.append((interval.lane, start, end, kind))
    return lanes, switches
