"""What `rlslice demo` measures: a job's cycle, one driver's timings, one mode's run. Pure.

`Profile` is a demo job's cycle (GPU rollout, CPU scoring, GPU training); a driver fills a
`JobRun`; a `ModeRun` is all jobs of a dedicated or time-sliced run, and computes the busy
fraction and the handoff overhead over its measured window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1 << 20


@dataclass(frozen=True)
class Profile:
    """One job's cycle: GPU rollout, CPU reward scoring, GPU training (seconds)."""

    # GPU 1.68 s of a 4 s cycle: a dedicated GPU is busy 42% of the time, what large RL
    # fleets report; two such jobs can fill one GPU to at most 84%, less the switches.
    rollout_seconds: float = 1.05
    score_seconds: float = 2.32
    train_seconds: float = 0.63
    state_mib: int = 256
    #: data preparation on the CPU after training (0: none, the default job)
    prepare_seconds: float = 0.0
    #: seconds after the window opens that the job starts its first cycle
    start_offset_seconds: float = 0.0

    @property
    def gpu_seconds(self) -> float:
        return self.rollout_seconds + self.train_seconds

    @property
    def cycle_seconds(self) -> float:
        return self.gpu_seconds + self.score_seconds + self.prepare_seconds


@dataclass
class JobRun:
    """What one job's driver measured."""

    job: str
    group: str
    cycles: int = 0
    cycle_seconds: list[float] = field(default_factory=list)
    #: when each cycle ended, seconds after the demo's origin
    cycle_ends: list[float] = field(default_factory=list)
    gpu_seconds: float = 0.0
    wait_seconds: float = 0.0
    switch_seconds: float = 0.0
    moved_bytes: int = 0
    intervals: list[tuple[str, float, float, str]] = field(default_factory=list)
    switches: list[tuple[float, float, int]] = field(default_factory=list)
    checksums: list[int] = field(default_factory=list)
    error: str = ""

    @property
    def mean_cycle(self) -> float:
        return sum(self.cycle_seconds) / len(self.cycle_seconds) if self.cycle_seconds else 0.0


@dataclass
class ModeRun:
    """A dedicated or time-sliced run of all jobs."""

    mode: str
    jobs: list[JobRun]
    started: float
    ended: float

    @property
    def wall(self) -> float:
        return max(self.ended - self.started, 1e-9)

    def gpu_seconds(self, job: JobRun) -> float:
        """Seconds `job` ran GPU phases inside the measured window."""
        lo, hi = self.started, self.ended
        return sum(
            max(0.0, min(end, hi) - max(start, lo))
            for _, start, end, kind in job.intervals
            if kind.startswith("gpu")
        )

    def busy_fraction(self) -> float:
        """GPU busy fraction over the window: GPU-phase seconds / wall seconds, per GPU."""
        busy = sum(self.gpu_seconds(j) for j in self.jobs) / self.wall
        return busy / len(self.jobs) if self.mode == "dedicated" else busy

    @property
    def switches(self) -> int:
        return sum(len(j.switches) for j in self.jobs)

    def handoff_overhead(self) -> float:
        """Mean seconds of each switch's handoff beyond the switch itself: from the moment
        the group was free and wanted (the outgoing job's GPU phase ended, or the incoming
        job asked, whichever came last) to the switch's start. That is the Yield and
        Acquire round trips and the drivers' and workers' pipes, which the scheduler's
        `switch_seconds` does not count; the simulator takes it as its per-switch
        `overhead_s`."""
        ends = sorted(
            end for job in self.jobs for _, _, end, kind in job.intervals if kind.startswith("gpu")
        )
        gaps = []
        for job in self.jobs:
            asks = {round(end, 6): start for _, start, end, kind in job.intervals if kind == "wait"}
            for switch_start, granted, _ in job.switches:
                asked = asks.get(round(granted, 6), switch_start)
                freed = max((end for end in ends if end <= switch_start), default=switch_start)
                gaps.append(max(0.0, switch_start - max(freed, asked)))
        return sum(gaps) / len(gaps) if gaps else 0.0

    @property
    def switch_seconds(self) -> float:
        return sum(j.switch_seconds for j in self.jobs)

    @property
    def moved_bytes(self) -> int:
        return sum(j.moved_bytes for j in self.jobs)
