"""Phase profiles: what a job does on the GPUs, measured or written by hand. Pure.

A `WorkloadProfile` is one job's repeating cycle of GPU and CPU phases (typical seconds,
jitter, percentiles), the device state a switch moves, the host memory parking it takes,
and the slowdown the job accepts. It is a pydantic model, so a YAML file written by hand
loads the same way as one `rlslice profile` wrote. A hand-written profile may give only
the shape of an RL step::

    name: grpo-a
    rollout_seconds: 1.05   # GPU
    cpu_seconds: 2.32       # reward scoring on the CPU
    train_seconds: 0.63     # GPU
    state_bytes: 256Mi
    max_slowdown: 1.2

`profiles_from_events` builds profiles from what a scheduler saw (`Watch` messages or a
recorded `rlslice timeline --save-log` file, as plain event values):

| measured | from |
|---|---|
| GPU phase (named by the acquire's phase) | GRANTED(job) to the job's YIELDED/PREEMPTED/UNREGISTERED |
| CPU phase after a GPU phase | the job's YIELDED to its next QUEUED |
| cycle | the shortest repeating sequence of phase names; one-off phases (a `load`) are left out |
| switches, state bytes | SWITCH_DONE events; bytes are split evenly between the job brought in and the job(s) it displaced (the events say only the sum), unless the caller knows them |
| copy rate | bytes over seconds of the SWITCH_DONE events |
| handoff seconds | per switch, from the group being free and wanted to the switch's start, plus from its end to the grant: what a switch costs beyond moving bytes |
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlslice.planner.interleave import JobProfile, Phase
from rlslice.planner.stats import percentile

#: Holds and gaps shorter than this are rounded up to it (the simulator needs positive phases).
MIN_PHASE_SECONDS = 1e-3
#: Measured seconds are kept to this many decimals (0.1 ms).
DIGITS = 4
#: Jitter estimated from percentiles is capped here.
MAX_JITTER = 0.5

_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgtKMGT]i?)?[bB]?\s*$")


def parse_bytes(value: object) -> int:
    """Bytes from an int or a quantity string: `268435456`, `256Mi`, `16Gi`, `1.5G`, `80GB`."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte count, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must be at least 0, got {value}")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        match = _QUANTITY.match(value)
        if match:
            number, unit = match.groups()
            return round(float(number) * _UNITS[(unit or "").lower()])
    raise ValueError(f"expected a byte count or a quantity like 256Mi or 16Gi, got {value!r}")


class Percentiles(BaseModel):
    """The distribution of one measured duration, in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(ge=1)
    """How many times it was measured."""
    mean: float = Field(ge=0)
    p10: float = Field(ge=0)
    p50: float = Field(ge=0)
    p90: float = Field(ge=0)
    p99: float = Field(ge=0)
    max: float = Field(ge=0)

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        """Percentiles of `values` (linear interpolation between order statistics)."""
        if not values:
            raise ValueError("percentiles of no values")
        ordered = sorted(values)
        return cls(
            count=len(ordered),
            mean=round(sum(ordered) / len(ordered), DIGITS),
            p10=round(percentile(ordered, 10), DIGITS),
            p50=round(percentile(ordered, 50), DIGITS),
            p90=round(percentile(ordered, 90), DIGITS),
            p99=round(percentile(ordered, 99), DIGITS),
            max=round(ordered[-1], DIGITS),
        )

    @property
    def jitter(self) -> float:
        """The half-width of the uniform spread that has this p10..p90, relative to the median
        (`U(1 - j, 1 + j)` has p90 - p10 = 1.6 j), capped at `MAX_JITTER`."""
        if self.p50 <= 0:
            return 0.0
        spread = (self.p90 - self.p10) / (1.6 * self.p50)
        return round(min(MAX_JITTER, max(0.0, spread)), DIGITS)


class ProfiledPhase(BaseModel):
    """One step of a job's cycle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=63)
    kind: Literal["gpu", "cpu"]
    seconds: float = Field(gt=0, allow_inf_nan=False)
    """Typical duration (the median when measured): what the simulator runs."""
    jitter: float = Field(default=0.0, ge=0, le=0.99)
    """Relative half-width of the uniform spread the simulator draws around `seconds`."""
    stats: Percentiles | None = None
    """The measured distribution, when measured."""


class SwitchMeasurements(BaseModel):
    """What the scheduler saw of a job's switches (measured profiles only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    switches: int = Field(default=0, ge=0)
    """Switches that brought the job in."""
    moved_bytes: int = Field(default=0, ge=0)
    """Bytes those switches moved (out and in)."""
    switch_seconds: Percentiles | None = None
    bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    """Moved bytes over seconds switching: the backend's measured copy rate."""
    handoff_seconds: Percentiles | None = None
    """Per switch, what it cost beyond moving bytes (the scheduler's own steps)."""


class WorkloadProfile(BaseModel):
    """One job's phase profile: the input of the placement advisor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Job id, a DNS-1123 label."""
    phases: tuple[ProfiledPhase, ...] = ()
    """The repeating cycle. A hand-written profile may give `rollout_seconds` (a GPU
    `rollout` phase), `cpu_seconds` (a CPU `score` phase after it) and `train_seconds` (a
    GPU `train` phase last) instead; they become these phases."""
    state_bytes: Annotated[int, Field(ge=0)] = 0
    """Device bytes per GPU a switch moves (quantities like `16Gi` are accepted)."""
    host_bytes: Annotated[int | None, Field(ge=0)] = None
    """Host memory per node parking the job takes; `state_bytes` when left out."""
    max_slowdown: float | None = Field(default=None, ge=1)
    """The slowdown this job accepts; the advisor's `--max-slowdown` when left out."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    weight: float = Field(default=1.0, gt=0, le=1000)
    source: str = "hand"
    """`hand`, or where a measured profile came from."""
    window_seconds: float | None = Field(default=None, ge=0)
    """Measured: seconds of the recording the profile covers."""
    cycles: int | None = Field(default=None, ge=0)
    """Measured: complete cycles recorded."""
    cycle_seconds_measured: Percentiles | None = None
    """Measured: wall seconds per cycle (waits included: a shared run's cycles are longer)."""
    switching: SwitchMeasurements | None = None

    @field_validator("state_bytes", "host_bytes", mode="before")
    @classmethod
    def _quantity(cls, value: Any) -> Any:
        return None if value is None else parse_bytes(value)

    @model_validator(mode="before")
    @classmethod
    def _phases_from_shortcuts(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        keys = ("rollout_seconds", "cpu_seconds", "train_seconds")
        if not any(key in data for key in keys):
            return data
        data = dict(data)
        rollout, cpu, train = (data.pop(key, None) for key in keys)
        if data.get("phases"):
            raise ValueError("give either phases or rollout/cpu/train_seconds, not both")
        built: list[dict[str, Any]] = []
        if rollout is not None:
            built.append({"name": "rollout", "kind": "gpu", "seconds": rollout})
        if cpu:
            built.append({"name": "score", "kind": "cpu", "seconds": cpu})
        if train is not None:
            built.append({"name": "train", "kind": "gpu", "seconds": train})
        data["phases"] = built
        return data

    @model_validator(mode="after")
    def _has_a_gpu_phase(self) -> WorkloadProfile:
        if not any(phase.kind == "gpu" for phase in self.phases):
            raise ValueError(
                "phases: the cycle needs a gpu phase (give phases, rollout_seconds or train_seconds)"
            )
        return self

    @property
    def cycle_seconds(self) -> float:
        """Nominal seconds of one cycle, alone on its GPUs."""
        return sum(phase.seconds for phase in self.phases)

    @property
    def gpu_fraction(self) -> float:
        """Share of a cycle on the GPUs: the busy fraction of dedicated GPUs."""
        return sum(p.seconds for p in self.phases if p.kind == "gpu") / self.cycle_seconds

    @property
    def parking_bytes(self) -> int:
        """Host bytes per node parking the job takes."""
        return self.state_bytes if self.host_bytes is None else self.host_bytes

    def to_job_profile(self, *, name: str | None = None, offset_s: float = 0.0) -> JobProfile:
        """The simulator's view of this profile (every GPU phase keeps `state_bytes`)."""
        return JobProfile(
            name=name or self.name,
            phases=tuple(
                Phase(
                    phase.name,
                    phase.kind,
                    phase.seconds,
                    jitter=phase.jitter,
                    device_bytes=self.state_bytes if phase.kind == "gpu" else 0,
                )
                for phase in self.phases
            ),
            priority=self.priority,
            weight=self.weight,
            offset_s=offset_s,
        )

    def renamed(self, name: str) -> WorkloadProfile:
        """The same profile for another job id (two runs of one job shape)."""
        return self.model_validate({**self.model_dump(exclude_none=True), "name": name})


def load_profiles(data: Any) -> tuple[WorkloadProfile, ...]:
    """Profiles from a parsed YAML/JSON document: one profile, a list, or `{profiles: [...]}`."""
    if isinstance(data, dict) and "profiles" in data and "name" not in data:
        data = data["profiles"]
    items = data if isinstance(data, list) else [data]
    return tuple(WorkloadProfile.model_validate(item) for item in items)


def dump_profiles(profiles: Sequence[WorkloadProfile]) -> dict[str, Any]:
    """The document `load_profiles` reads back (`{profiles: [...]}`, empty fields left out)."""
    return {"profiles": [p.model_dump(mode="json", exclude_none=True) for p in profiles]}


# --- from a scheduler's events -----------------------------------------------------------------


class EventLike(Protocol):
    """The fields of a scheduler event the profiler reads (`rlslice.apps.trace_export.Event`)."""

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


__all__ = [
    "EventLike",
    "Percentiles",
    "ProfiledPhase",
    "SwitchMeasurements",
    "WorkloadProfile",
    "dump_profiles",
    "load_profiles",
    "parse_bytes",
    "profiles_from_events",
]
