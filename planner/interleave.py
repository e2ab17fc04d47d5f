"""Interleaving simulator: N jobs taking turns on one group of GPUs.

Each job is a cycle of phases. A GPU phase needs the group: the job acquires it (waiting
in the group's queue, ordered by the policy), runs, and yields when its next phase is a
CPU phase. CPU phases (reward scoring, data preparation, waiting for stragglers) run
beside other jobs' GPU phases: that is where time-slicing wins.

Switching follows rlslice's design (../shared/DESIGN.md, "Switch"):

- a yield with no waiter moves nothing: the job stays resident (deferred snapshot);
- a grant to a job whose state is resident, or fits beside the resident ones, is
  immediate (co-residency);
- otherwise least-recently-used resident jobs are evicted until the incoming job fits,
  and the switch takes `overhead_s + bytes_out / bandwidth + bytes_in / bandwidth`.

A GPU phase's `device_bytes` is the job's device footprint during and after the phase
(the state a snapshot would move). Durations may jitter: each phase is drawn from
`seconds * U(1 - jitter, 1 + jitter)`, from a stream per job, so the dedicated and the
time-sliced runs see the same durations. Time is simulated: an hour takes milliseconds.

Busy fractions count GPU-phase time only (not switching). "Dedicated" gives each job its
own group: the fraction is the mean over those groups. "Time-sliced" is the one shared group.
A job's step time is the mean length of its cycles completed within the horizon.

The queue is ordered by `policy`: the built-in `fifo`, `priority` (no aging) and `fair`
keys, or, given a `picker` (`rlslice.planner.waiters`), by that function; `rlslice
simulate` passes one made of the scheduler's own policy code, so every scheduler policy
(`lrs`, `stage`, ...) is simulated by the code the scheduler runs.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks
from rlslice.planner.jobs import POLICIES as POLICIES
from rlslice.planner.jobs import Durations, mean_step, run_alone
from rlslice.planner.jobs import JobProfile as JobProfile
from rlslice.planner.jobs import Phase as Phase
from rlslice.planner.jobs import PhaseResource as PhaseResource
from rlslice.planner.jobs import Policy as Policy
from rlslice.planner.timeline import SwitchMarker, TimelineInterval
from rlslice.planner.waiters import Picker, QueuedJob


@dataclass(frozen=True)
class JobOutcome:
    """One job, dedicated vs time-sliced, over the same horizon."""

    name: str
    dedicated_cycles: int
    sliced_cycles: int
    dedicated_busy_fraction: float
    #: GPU-phase seconds the job ran when time-sliced
    sliced_gpu_seconds: float
    #: seconds spent waiting for the group (queue and switches)
    wait_seconds: float
    #: how much longer the same work takes: active seconds dedicated / active seconds sliced
    slowdown: float
    #: mean seconds of a cycle completed within the horizon, alone (0: none completed)
    dedicated_step_seconds: float = 0.0
    #: the same, time-sliced
    step_seconds: float = 0.0


@dataclass(frozen=True)
class InterleaveResult:
    """What the simulator predicts for one group."""

    policy: str
    horizon_s: float
    dedicated_busy_fraction: float
    sliced_busy_fraction: float
    switches: int
    switch_seconds_total: float
    moved_bytes_total: int
    #: holder changes that moved nothing because the incoming job was resident
    coresident_grants: int
    jobs: tuple[JobOutcome, ...]
    intervals: tuple[TimelineInterval, ...]
    switch_markers: tuple[SwitchMarker, ...]

    @property
    def min_step_seconds(self) -> float:
        """The shortest time-sliced step time of the jobs that completed a cycle (0: none)."""
        steps = [job.step_seconds for job in self.jobs if job.step_seconds > 0]
        return min(steps) if steps else 0.0

    @property
    def gpus_saved(self) -> float:
        """Groups freed by sharing: len(jobs) dedicated groups become one."""
        return float(len(self.jobs) - 1)


@dataclass
class _JobState:
    job: JobProfile
    index: int
    step: int = 0
    requested_at: float = 0.0
    footprint: int = 0
    resident: bool = False
    last_used: float = 0.0
    gpu_seconds: float = 0.0
    wait_seconds: float = 0.0
    active_seconds: float = 0.0
    ticket: int = 0
    granted_at: float | None = None
    served_at: float | None = None
    hold_started: float = 0.0
    held_seconds: float = 0.0
    cycle_ends: list[float] | None = None

    @property
    def phase(self) -> Phase:
        return self.job.phases[self.step % len(self.job.phases)]

    def hold_need(self) -> int:
        """Device bytes for the run of consecutive GPU phases starting now."""
        phases, count, need = self.job.phases, len(self.job.phases), 0
        for offset in range(count):
            phase = phases[(self.step + offset) % count]
            if phase.kind != "gpu":
                break
            need = max(need, phase.device_bytes)
        return max(need, self.footprint)


class _Group:
    """Mutable state of the shared group during one simulation."""

    def __init__(
        self,
        jobs: Sequence[JobProfile],
        seed: int,
        *,
        gpu_bytes: int,
        bandwidth: float,
        overhead: float,
        policy: str,
        horizon: float,
        picker: Picker | None = None,
    ) -> None:
        self.states = [_JobState(job, i, cycle_ends=[]) for i, job in enumerate(jobs)]
        self.picker = picker
        self.tickets = 0
        self.durations = [Durations(job, seed) for job in jobs]
        self.gpu_bytes, self.bandwidth, self.overhead = gpu_bytes, bandwidth, overhead
        self.policy, self.horizon = policy, horizon
        self.events: list[tuple[float, int, str, int]] = []
        self.sequence = 0
        self.waiting: list[_JobState] = []
        self.busy = False  # a holder or a switch in progress
        self.last_holder: int | None = None
        self.switches = self.coresident = self.moved = 0
        self.switch_seconds = 0.0
        self.intervals: list[TimelineInterval] = []
        self.markers: list[SwitchMarker] = []

    def schedule(self, at: float, kind: str, job: int) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (at, self.sequence, kind, job))

    def span(self, state: _JobState, kind: str, start: float, end: float) -> None:
        end = min(end, self.horizon)
        if end > start:
            self.intervals.append(TimelineInterval(state.job.name, start, end, kind))

    def start_phase(self, state: _JobState, now: float) -> None:
        """Begin the job's current phase: CPU runs at once, GPU needs the group."""
        phase = state.phase
        if phase.kind == "cpu":
            seconds = self.durations[state.index].get(state.step)
            self.span(state, f"cpu:{phase.name}", now, now + seconds)
            state.active_seconds += min(now + seconds, self.horizon) - now
            self.schedule(now + seconds, "done", state.index)
        else:
            state.requested_at = now
            self.tickets += 1
            state.ticket = self.tickets
            self.waiting.append(state)

    def run_gpu(self, state: _JobState, now: float) -> None:
        phase = state.phase
        seconds = self.durations[state.index].get(state.step)
        state.footprint = phase.device_bytes
        state.resident, state.last_used = True, now
        self.span(state, f"gpu:{phase.name}", now, now + seconds)
        ran = min(now + seconds, self.horizon) - now
        state.gpu_seconds += ran
        state.active_seconds += ran
        self.schedule(now + seconds, "done", state.index)

    def pick(self, now: float) -> _JobState:
        if self.picker is not None:
            queue = sorted(self.waiting, key=lambda s: s.ticket)
            name = self.picker([_queued(s) for s in queue], now)
            chosen = next(s for s in queue if s.job.name == name)
            self.waiting.remove(chosen)
            return chosen

        def key(state: _JobState) -> tuple[float, ...]:
            fifo = (state.requested_at, float(state.index))
            if self.policy == "priority":
                return (-float(state.job.priority), *fifo)
            if self.policy == "fair":
                return (state.gpu_seconds / state.job.weight, *fifo)
            return fifo

        chosen = min(self.waiting, key=key)
        self.waiting.remove(chosen)
        return chosen

    def grant(self, now: float) -> None:
        if self.busy or not self.waiting:
            return
        state = self.pick(now)
        state.granted_at = state.hold_started = now
        need = state.hold_need()
        others = sorted(
            (s for s in self.states if s.resident and s is not state), key=lambda s: s.last_used
        )
        free = self.gpu_bytes - sum(s.footprint for s in others)
        evicted: list[_JobState] = []
        for victim in others:  # least recently used first
            if free >= need:
                break
            evicted.append(victim)
            free += victim.footprint
        bytes_out = sum(s.footprint for s in evicted)
        bytes_in = 0 if state.resident else state.footprint
        for victim in evicted:
            victim.resident = False
        self.busy = True
        outgoing = self.last_holder
        self.last_holder = state.index
        if bytes_out == 0 and bytes_in == 0:
            if outgoing is not None and outgoing != state.index:
                self.coresident += 1
            self.span(state, "wait", state.requested_at, now)
            state.wait_seconds += min(now, self.horizon) - min(state.requested_at, self.horizon)
            self.run_gpu(state, now)
            return
        seconds = self.overhead + bytes_out / self.bandwidth + bytes_in / self.bandwidth
        self.switches += 1
        self.moved += bytes_out + bytes_in
        self.switch_seconds += max(0.0, min(now + seconds, self.horizon) - now)
        if now < self.horizon:
            self.markers.append(
                SwitchMarker(
                    start=now,
                    end=min(now + seconds, self.horizon),
                    incoming=state.job.name,
                    outgoing=tuple(v.job.name for v in evicted),
                    moved_bytes=bytes_out + bytes_in,
                )
            )
        self.schedule(now + seconds, "switched", state.index)

    def on_switched(self, state: _JobState, now: float) -> None:
        self.span(state, "wait", state.requested_at, now)
        state.wait_seconds += min(now, self.horizon) - min(state.requested_at, self.horizon)
        self.run_gpu(state, now)

    def on_done(self, state: _JobState, now: float) -> None:
        was_gpu = state.phase.kind == "gpu"
        state.step += 1
        if state.step % len(state.job.phases) == 0 and state.cycle_ends is not None:
            state.cycle_ends.append(now)
        if was_gpu:
            state.last_used = now
            if state.phase.kind == "gpu":  # keep holding through consecutive GPU phases
                self.run_gpu(state, now)
                return
            self.busy = False  # yield
            state.served_at = now
            state.held_seconds += now - state.hold_started
        self.start_phase(state, now)

    def run(self) -> None:
        for state in self.states:
            self.schedule(state.job.offset_s, "start", state.index)
        while self.events and self.events[0][0] <= self.horizon:
            now, _, kind, index = heapq.heappop(self.events)
            state = self.states[index]
            if kind == "start":
                self.start_phase(state, now)
            elif kind == "switched":
                self.on_switched(state, now)
            else:
                self.on_done(state, now)
            self.grant(now)
        for state in self.waiting:  # still queued at the horizon
            self.span(state, "wait", state.requested_at, self.horizon)
            state.wait_seconds += max(0.0, self.horizon - state.requested_at)

    def cycles(self, state: _JobState) -> int:
        return state.step // len(state.job.phases)


def _queued(state: _JobState) -> QueuedJob:
    """A waiter as a policy sees it."""
    return QueuedJob(
        job=state.job.name,
        ticket=state.ticket,
        since=state.requested_at,
        phase=state.phase.name,
        priority=state.job.priority,
        weight=state.job.weight,
        held_seconds=state.held_seconds,
        last_served_at=state.served_at,
        last_granted_at=state.granted_at,
    )


def _validate_jobs(jobs: Sequence[JobProfile], gpu_bytes: int) -> tuple[JobProfile, ...]:
    if not isinstance(jobs, list | tuple) or not jobs:
        raise InvalidArgumentError("jobs must be a non-empty sequence of JobProfile")
    for job in jobs:
        if not isinstance(job, JobProfile):
            raise InvalidArgumentError(
                f"jobs must hold JobProfile values, got {type(job).__name__}"
            )
        if job.peak_device_bytes > gpu_bytes:
            raise InvalidArgumentError(
                f"job {job.name!r} needs {job.peak_device_bytes} device bytes; gpu_bytes is {gpu_bytes}"
            )
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise InvalidArgumentError("jobs must have distinct names")
    return tuple(jobs)


def _slowdown(alone: float, shared: float) -> float:
    if alone <= 0:
        return 1.0  # the job had not started by the horizon
    return alone / shared if shared > 0 else float("inf")


def _outcome(
    job: JobProfile, state: _JobState, group: _Group, seed: int, horizon: float
) -> JobOutcome:
    """The job run alone (same draws, by the seed) next to its share of the sliced `group`."""
    cycles, gpu, step = run_alone(job, Durations(job, seed), horizon)
    active_dedicated = max(0.0, horizon - job.offset_s)
    return JobOutcome(
        name=job.name,
        dedicated_cycles=cycles,
        sliced_cycles=group.cycles(state),
        dedicated_busy_fraction=gpu / horizon,
        sliced_gpu_seconds=state.gpu_seconds,
        wait_seconds=state.wait_seconds,
        slowdown=_slowdown(active_dedicated, state.active_seconds),
        dedicated_step_seconds=step,
        step_seconds=mean_step(job.offset_s, state.cycle_ends or ()),
    )


def simulate_interleaving(
    jobs: Sequence[JobProfile],
    *,
    gpu_bytes: int,
    bandwidth_bytes_per_s: float,
    overhead_s: float = 0.0,
    policy: str = "fifo",
    horizon_s: float = 3600.0,
    seed: int = 0,
    picker: Picker | None = None,
) -> InterleaveResult:
    """Run `jobs` dedicated (one group each) and time-sliced (one shared group); compare.

    `gpu_bytes` is the device memory of the group per GPU (after any headroom) and
    `bandwidth_bytes_per_s` the host<->device copy rate per GPU; `device_bytes` of the
    phases are per GPU too, so a group of many GPUs is modelled by one of them.
    `picker` orders the queue instead of the built-in key of `policy`, which then only
    names the policy in the result.
    """
    capacity = _checks.integer("gpu_bytes", gpu_bytes, minimum=1)
    bandwidth = _checks.real("bandwidth_bytes_per_s", bandwidth_bytes_per_s, positive=True)
    overhead = _checks.real("overhead_s", overhead_s, minimum=0)
    if picker is None:
        chosen = _checks.choice("policy", policy, POLICIES)
    elif callable(picker):
        chosen = _checks.name("policy", policy)
    else:
        raise InvalidArgumentError(f"picker must be callable, got {type(picker).__name__}")
    horizon = _checks.real("horizon_s", horizon_s, positive=True)
    _checks.integer("seed", seed)
    profiles = _validate_jobs(jobs, capacity)

    group = _Group(
        profiles,
        seed,
        gpu_bytes=capacity,
        bandwidth=bandwidth,
        overhead=overhead,
        policy=chosen,
        horizon=horizon,
        picker=picker,
    )
    group.run()

    outcomes = [
        _outcome(job, state, group, seed, horizon)
        for job, state in zip(profiles, group.states, strict=True)
    ]
    dedicated_total = sum(outcome.dedicated_busy_fraction for outcome in outcomes)
    return InterleaveResult(
        policy=chosen,
        horizon_s=horizon,
        dedicated_busy_fraction=dedicated_total / len(profiles),
        sliced_busy_fraction=sum(s.gpu_seconds for s in group.states) / horizon,
        switches=group.switches,
        switch_seconds_total=group.switch_seconds,
        moved_bytes_total=group.moved,
        coresident_grants=group.coresident,
        jobs=tuple(outcomes),
        intervals=tuple(sorted(group.intervals, key=lambda i: (i.start, i.job))),
        switch_markers=tuple(group.markers),
    )


def iter_gpu_intervals(result: InterleaveResult) -> Iterator[TimelineInterval]:
    """The GPU phases of the time-sliced run, in time order."""
    return (i for i in result.intervals if i.kind.startswith("gpu"))
