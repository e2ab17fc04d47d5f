"""Ready-made and YAML-described interleaving scenarios for `simulate_interleaving`.

`article_scenario()` is seed 003's case: two synchronous GRPO jobs, each keeping its GPUs
busy about 40 % of the time when it owns them (rollout and training on the GPU; reward
scoring and data preparation on the CPU), sharing one group of 80 GiB GPUs.
Time-sliced, the group is busy well over 70 % of the time.

`scenario_from_mapping(data)` reads the plain structure a YAML file holds::

    group: {gpu_memory_gib: 80, bandwidth_gb_per_s: 25, overhead_s: 0.5}
    horizon_s: 3600
    policy: fifo
    seed: 0
    jobs:
      - name: grpo-a
        priority: 0          # optional; also weight, offset_s
        phases:
          - {name: rollout, kind: gpu, seconds: 100, jitter: 0.1, device_gib: 32}
          - {name: reward, kind: cpu, seconds: 130, jitter: 0.1}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks
from rlslice.planner.interleave import (
    InterleaveResult,
    JobProfile,
    Phase,
    simulate_interleaving,
)
from rlslice.planner.memory import BYTES_PER_GIB


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

    def run(
        self, *, policy: str | None = None, horizon_s: float | None = None, seed: int | None = None
    ) -> InterleaveResult:
        """Simulate, optionally overriding the policy, horizon or seed."""
        return simulate_interleaving(
            self.jobs,
            gpu_bytes=self.gpu_bytes,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            overhead_s=self.overhead_s,
            policy=self.policy if policy is None else policy,
            horizon_s=self.horizon_s if horizon_s is None else horizon_s,
            seed=self.seed if seed is None else seed,
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
        policy=_checks.choice("policy", root.get("policy", "fifo"), ("fifo", "priority", "fair")),
        seed=_checks.integer("seed", root.get("seed", 0)),
    )
