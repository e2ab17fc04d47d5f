"""A simulated job: its repeating cycle of phases (`Phase`, `JobProfile`) and its draws.

Used by the interleaving simulator (`rlslice.planner.interleave`, which re-exports
these names); a job alone on its own group is simulated here (`run_alone`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks

#: Where a phase runs (not `rlslice.config.PhaseKind`, which says what a phase is for).
PhaseResource = Literal["gpu", "cpu"]
Policy = Literal["fifo", "priority", "fair"]
#: The policies the simulator orders by itself (any other needs a `Picker`).
POLICIES: tuple[str, ...] = ("fifo", "priority", "fair")


@dataclass(frozen=True)
class Phase:
    """One step of a job's cycle."""

    name: str
    kind: PhaseResource
    seconds: float
    #: relative half-width of the uniform jitter on `seconds` (0.1: +-10 %)
    jitter: float = 0.0
    #: GPU phases: bytes the job keeps on the device during and after this phase
    device_bytes: int = 0

    def __post_init__(self) -> None:
        _checks.name("phase name", self.name)
        _checks.choice(f"phase {self.name!r} kind", self.kind, ("gpu", "cpu"))
        _checks.real(f"phase {self.name!r} seconds", self.seconds, positive=True)
        _checks.real(f"phase {self.name!r} jitter", self.jitter, minimum=0, maximum=0.99)
        _checks.integer(f"phase {self.name!r} device_bytes", self.device_bytes, minimum=0)


@dataclass(frozen=True)
class JobProfile:
    """A job's repeating cycle of phases and its scheduling attributes."""

    name: str
    phases: tuple[Phase, ...]
    #: higher runs first under the `priority` policy
    priority: int = 0
    #: share under the `fair` policy
    weight: float = 1.0
    #: the job starts this many seconds into the run
    offset_s: float = 0.0

    def __post_init__(self) -> None:
        _checks.name("job name", self.name)
        if not isinstance(self.phases, tuple) or not self.phases:
            raise InvalidArgumentError(f"job {self.name!r} phases must be a non-empty tuple")
        if not any(phase.kind == "gpu" for phase in self.phases):
            raise InvalidArgumentError(f"job {self.name!r} phases must include a gpu phase")
        _checks.integer(f"job {self.name!r} priority", self.priority)
        _checks.real(f"job {self.name!r} weight", self.weight, positive=True)
        _checks.real(f"job {self.name!r} offset_s", self.offset_s, minimum=0)

    @property
    def cycle_seconds(self) -> float:
        """Nominal length of one cycle."""
        return sum(phase.seconds for phase in self.phases)

    @property
    def gpu_fraction(self) -> float:
        """Nominal share of a cycle spent in GPU phases: its dedicated busy fraction."""
        gpu = sum(phase.seconds for phase in self.phases if phase.kind == "gpu")
        return gpu / self.cycle_seconds

    @property
    def peak_device_bytes(self) -> int:
        """The largest device footprint of any phase."""
        return max(phase.device_bytes for phase in self.phases)


class Durations:
    """Each job's phase durations, drawn in order from its own seeded stream."""

    def __init__(self, job: JobProfile, seed: int) -> None:
        self._job = job
        self._rng = random.Random(f"{seed}:{job.name}")
        self._drawn: list[float] = []

    def get(self, index: int) -> float:
        while len(self._drawn) <= index:
            phase = self._job.phases[len(self._drawn) % len(self._job.phases)]
            spread = phase.jitter
            factor = self._rng.uniform(1 - spread, 1 + spread) if spread else 1.0
            self._drawn.append(phase.seconds * factor)
        return self._drawn[index]


def run_alone(job: JobProfile, durations: Durations, horizon: float) -> tuple[int, float, float]:
    """Completed cycles, GPU seconds and mean step seconds of `job` alone on its group."""
    now, step, gpu = job.offset_s, 0, 0.0
    count = len(job.phases)
    ends: list[float] = []
    while now < horizon:
        seconds = durations.get(step)
        if job.phases[step % count].kind == "gpu":
            gpu += min(now + seconds, horizon) - now
        now += seconds
        step += 1
        if now > horizon:
            step -= 1
        elif step % count == 0:
            ends.append(now)
    return step // count, gpu, mean_step(job.offset_s, ends)


def mean_step(start: float, ends: Sequence[float]) -> float:
    """Mean cycle length, cycles ending at `ends`, the first one begun at `start`."""
    return (ends[-1] - start) / len(ends) if ends else 0.0
