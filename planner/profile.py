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

`rlslice.planner.profile_events.profiles_from_events` builds profiles from what a
scheduler saw (`Watch` messages or a recorded `rlslice timeline --save-log` file, as plain
event values):

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

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

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


__all__ = [
    "Percentiles",
    "ProfiledPhase",
    "SwitchMeasurements",
    "WorkloadProfile",
    "dump_profiles",
    "load_profiles",
    "parse_bytes",
]
