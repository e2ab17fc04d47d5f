"""Ready-made and YAML-described interleaving scenarios for `simulate_interleaving`.

`article_scenario()` is seed 003's case: two synchronous GRPO jobs, each keeping its GPUs
busy about 40 % of the time when it owns them (rollout and training on the GPU; reward
scoring and data preparation on the CPU), sharing one group of 80 GiB GPUs.
Time-sliced, the group is busy well over 70 % of the time.

`three_jobs_scenario()` is issue 27's case for the waiter-ordering policies: three RL jobs
with unequal phases on one 80 GiB group (docs/planner.md, "Policies: three jobs"), more
GPU work than one group has (their GPU fractions sum to 1.52), so the order decides who
waits. `SCENARIOS` names the built-in ones.

`scenario_from_mapping(data)` reads the plain structure a YAML file holds::

    group: {gpu_memory_gib: 80, bandwidth_gb_per_s: 25, overhead_s: 0.5}
    horizon_s: 3600
    policy: fifo         # any scheduler policy: fifo, priority, fair, lrs, stage
    seed: 0
    phases: {rollout: rollout, train: train}   # optional: GPU phase name -> kind
    jobs:
      - name: grpo-a
        priority: 0          # optional; also weight, offset_s
        phases:
          - {name: rollout, kind: gpu, seconds: 100, jitter: 0.1, device_gib: 32}
          - {name: reward, kind: cpu, seconds: 130, jitter: 0.1}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlslice._errors import InvalidArgumentError
from rlslice.config import PHASE_KINDS, Policy
from rlslice.planner import _checks
from rlslice.planner.interleave import (
    InterleaveResult,
    JobProfile,
    Phase,
    simulate_interleaving,
)
from rlslice.planner.memory import BYTES_PER_GIB
from rlslice.planner.waiters import Picker


@dataclass(frozen=True)
class Scenario:
    """Jobs and the group they share, ready for `simulate_interleaving`."""

    jobs: tuple[JobProfile, ...]
    gpu_bytes: int
    bandwidth_bytes_per_s: float
    overhead_s: float = 0.0
    horizon_s: float = 3600.0
    policy: str = "fifo"
    seed: int = 0
    phase_kinds: Mapping[str, str] = field(default_factory=dict)
    """GPU phase name -> its kind (`rollout`, `train`, `sync`), as the group spec's
    `phases` would declare it; the `stage` policy orders by it."""

    def run(
        self,
        *,
        policy: str | None = None,
        horizon_s: float | None = None,
        seed: int | None = None,
        picker: Picker | None = None,
    ) -> InterleaveResult:
        """Simulate, optionally overriding the policy, horizon or seed; `picker` orders
        the queue (see `simulate_interleaving`)."""
        return simulate_interleaving(
            self.jobs,
            gpu_bytes=self.gpu_bytes,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            overhead_s=self.overhead_s,
            policy=self.policy if policy is None else policy,
            horizon_s=self.horizon_s if horizon_s is None else horizon_s,
            seed=self.seed if seed is None else seed,
            picker=picker,
        )


def _grpo_job(name: str) -> JobProfile:
    # Footprints per GPU from the course module's 7B example: rollout holds 14 GiB of bf16
    # weights, a 16 GiB KV cache and 2 GiB of buffers (32 GiB); training holds weights,
    # 8 GiB of activations and 28 GiB of optimizer state (50 GiB). GPU 160 s of 400 s.
    return JobProfile(
        name=name,
        phases=(
            Phase("rollout", "gpu", 100.0, jitter=0.1, device_bytes=32 * BYTES_PER_GIB),
            Phase("reward", "cpu", 130.0, jitter=0.1),
            Phase("train", "gpu", 60.0, jitter=0.1, device_bytes=50 * BYTES_PER_GIB),
            Phase("prepare", "cpu", 110.0, jitter=0.1),
        ),
    )


def article_scenario() -> Scenario:
    """Two synchronous GRPO jobs, dedicated busy fraction about 0.40 each (seed 003)."""
    return Scenario(
        jobs=(_grpo_job("grpo-a"), _grpo_job("grpo-b")),
        gpu_bytes=80 * BYTES_PER_GIB,
        bandwidth_bytes_per_s=25e9,
        overhead_s=0.5,
        horizon_s=3600.0,
        policy="fifo",
        seed=0,
    )


def _job(name: str, rollout: float, reward: float, train: float, prepare: float) -> JobProfile:
    """Rollout (32 GiB: weights, KV cache) and train (50 GiB: weights, optimizer state) on
    the GPU, reward scoring and data preparation on the CPU, 10 % jitter on each."""
    return JobProfile(
        name=name,
        phases=(
            Phase("rollout", "gpu", rollout, jitter=0.1, device_bytes=32 * BYTES_PER_GIB),
            Phase("reward", "cpu", reward, jitter=0.1),
            Phase("train", "gpu", train, jitter=0.1, device_bytes=50 * BYTES_PER_GIB),
            Phase("prepare", "cpu", prepare, jitter=0.1),
        ),
    )


#: (name, rollout, reward, train, prepare) seconds of the three-jobs scenario.
THREE_JOBS: tuple[tuple[str, float, float, float, float], ...] = (
    # Long chain-of-thought generation, a LoRA update: GPU 195 of 415 s.
    ("rollout-heavy", 170.0, 115.0, 25.0, 105.0),
    # A GRPO step of the course's shape: GPU 105 of 225 s.
    ("balanced", 50.0, 45.0, 55.0, 75.0),
    # Short answers, a full fine-tune of a large batch: GPU 260 of 445 s.
    ("train-heavy", 30.0, 110.0, 230.0, 75.0),
)


def three_jobs_scenario() -> Scenario:
    """Three RL jobs with unequal phases sharing one group of 80 GiB GPUs (issue 27)."""
    return Scenario(
        jobs=tuple(_job(*shape) for shape in THREE_JOBS),
        gpu_bytes=80 * BYTES_PER_GIB,
        bandwidth_bytes_per_s=25e9,
        overhead_s=0.5,
        horizon_s=7200.0,
        policy="fifo",
        seed=0,
        phase_kinds={"rollout": "rollout", "train": "train"},
    )


#: The built-in scenarios by name (`rlslice simulate --scenario NAME`).
SCENARIOS: Mapping[str, Callable[[], Scenario]] = {
    "article": article_scenario,
    "three-jobs": three_jobs_scenario,
}


def _bytes(where: str, data: Mapping[str, Any], stem: str, default: int = 0) -> int:
    """`<stem>_bytes` (an integer) or `<stem>_gib` (a number of GiB)."""
    if f"{stem}_bytes" in data and f"{stem}_gib" in data:
        raise InvalidArgumentError(f"{where}: give {stem}_bytes or {stem}_gib, not both")
    if f"{stem}_bytes" in data:
        return _checks.integer(f"{where}.{stem}_bytes", data[f"{stem}_bytes"], minimum=0)
    if f"{stem}_gib" in data:
        gib = _checks.real(f"{where}.{stem}_gib", data[f"{stem}_gib"], minimum=0)
        return round(gib * BYTES_PER_GIB)
    return default


def _mapping(where: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _sequence(where: str, value: object) -> Sequence[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
        raise InvalidArgumentError(f"{where} must be a non-empty list")
    return value


def scenario_from_mapping(data: object) -> Scenario:
    """A `Scenario` from parsed YAML/JSON (see the module docstring for the layout)."""
    root = _mapping("scenario", data)
    group = _mapping("group", root.get("group", {}))
    gpu_bytes = _bytes("group", group, "gpu_memory")
    if gpu_bytes <= 0:
        raise InvalidArgumentError("group.gpu_memory_gib (or gpu_memory_bytes) is required")
    headroom = _bytes("group", group, "headroom")
    bandwidth = _checks.real(
        "group.bandwidth_gb_per_s", group.get("bandwidth_gb_per_s", 25.0), positive=True
    )
    jobs = []
    for j, raw in enumerate(_sequence("jobs", root.get("jobs"))):
        job = _mapping(f"jobs[{j}]", raw)
        phases = []
        for p, raw_phase in enumerate(_sequence(f"jobs[{j}].phases", job.get("phases"))):
            phase = _mapping(f"jobs[{j}].phases[{p}]", raw_phase)
            phases.append(
                Phase(
                    name=phase.get("name", ""),
                    kind=phase.get("kind", ""),
                    seconds=phase.get("seconds", 0),
                    jitter=phase.get("jitter", 0.0),
                    device_bytes=_bytes(f"jobs[{j}].phases[{p}]", phase, "device"),
                )
            )
        jobs.append(
            JobProfile(
                name=job.get("name", ""),
                phases=tuple(phases),
                priority=job.get("priority", 0),
                weight=job.get("weight", 1.0),
                offset_s=job.get("offset_s", 0.0),
            )
        )
    return Scenario(
        jobs=tuple(jobs),
        gpu_bytes=gpu_bytes - headroom,
        bandwidth_bytes_per_s=bandwidth * 1e9,
        overhead_s=_checks.real("group.overhead_s", group.get("overhead_s", 0.0), minimum=0),
        horizon_s=_checks.real("horizon_s", root.get("horizon_s", 3600.0), positive=True),
        policy=_checks.choice("policy", root.get("policy", "fifo"), [p.value for p in Policy]),
        seed=_checks.integer("seed", root.get("seed", 0)),
        phase_kinds=_phase_kinds(root.get("phases", {})),
    )


def _phase_kinds(value: object) -> dict[str, str]:
    """`phases: {name: kind}`, each kind one the group spec accepts."""
    return {
        _checks.name("phases key", name): _checks.choice(f"phases.{name}", kind, PHASE_KINDS)
        for name, kind in _mapping("phases", value).items()
    }
