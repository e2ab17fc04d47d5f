"""Capacity checks: do these jobs fit on these nodes when they take turns?

For each group: the per-phase device footprint of every job per GPU (`peak_memory` over
the phases), whether each job fits a GPU at its peak, the host DRAM needed on each node
to park every job at once (during a switch the outgoing job is already on the host while
the incoming one is still there), which pairs of jobs can be co-resident, and the
expected seconds of a switch. The verdict names the reason when something does not fit.

`host_capacity_verdict` is the small rule the scheduler applies at registration: refuse a
job whose parked state would not fit in the nodes' host memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks
from rlslice.planner.memory import (
    BYTES_PER_GIB,
    human_bytes,
    ideal_sharded_memory,
    kv_cache_bytes,
    model_state_bytes,
    peak_memory,
)


@dataclass(frozen=True)
class FitVerdict:
    """Whether something fits, and a one-line reason either way."""

    fits: bool
    reason: str


def host_capacity_verdict(
    parked_bytes: Sequence[int],
    new_job_bytes: int,
    host_available_bytes: int,
    reserve_bytes: int = 0,
) -> FitVerdict:
    """Can a node park `new_job_bytes` beside the states it already parks, keeping a reserve?

    Fits when `sum(parked_bytes) + new_job_bytes + reserve_bytes <= host_available_bytes`.
    """
    parked = [
        _checks.integer(f"parked_bytes[{i}]", value, minimum=0)
        for i, value in enumerate(parked_bytes)
    ]
    new = _checks.integer("new_job_bytes", new_job_bytes, minimum=0)
    available = _checks.integer("host_available_bytes", host_available_bytes, minimum=0)
    reserve = _checks.integer("reserve_bytes", reserve_bytes, minimum=0)
    needed = sum(parked) + new + reserve
    detail = (
        f"{len(parked)} parked job(s) {human_bytes(sum(parked))} + new job {human_bytes(new)}"
        f" + reserve {human_bytes(reserve)} = {human_bytes(needed)}"
    )
    if needed <= available:
        return FitVerdict(True, f"fits: {detail} of {human_bytes(available)} host memory")
    return FitVerdict(
        False,
        f"host memory exhausted: {detail} needed, {human_bytes(available)} available",
    )


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: int
    gpu_memory_bytes: int
    host_memory_bytes: int
    #: host<->device copy rate of one GPU, bytes per second
    host_device_bytes_per_s: float


@dataclass(frozen=True)
class PlanGroup:
    """A group as the capacity check is given it (the check's answer is a `GroupPlan`)."""

    name: str
    nodes: tuple[str, ...]
    headroom_bytes: int = 0
    host_reserve_bytes: int = 0
    switch_overhead_s: float = 0.5


@dataclass(frozen=True)
class PlanJob:
    """A job's size; `phases` are whole-job byte parts per phase (all GPUs together)."""

    name: str
    group: str
    phases: Mapping[str, tuple[int, ...]]
    #: GPUs the state is spread over; None: every GPU of the group
    shards: int | None = None


@dataclass(frozen=True)
class JobFootprint:
    name: str
    #: bytes per GPU in each phase
    phase_bytes: Mapping[str, int]
    peak_phase: str
    peak_bytes: int


@dataclass(frozen=True)
class GroupPlan:
    name: str
    verdict: FitVerdict
    problems: tuple[str, ...]
    jobs: tuple[JobFootprint, ...]
    usable_gpu_bytes: int
    #: per node: (needed, available) host bytes to park every job of the group at once
    host_bytes: Mapping[str, tuple[int, int]]
    coresident_pairs: tuple[tuple[str, str], ...]
    all_coresident: bool
    #: (outgoing, incoming) -> seconds; 0 when the pair can be co-resident
    switch_seconds: Mapping[tuple[str, str], float] = field(default_factory=dict)

    @property
    def max_switch_seconds(self) -> float:
        return max(self.switch_seconds.values(), default=0.0)


@dataclass(frozen=True)
class CapacityPlan:
    groups: tuple[GroupPlan, ...]

    @property
    def fits(self) -> bool:
        return all(group.verdict.fits for group in self.groups)


def plan_capacity(
    nodes: Sequence[NodeSpec], groups: Sequence[PlanGroup], jobs: Sequence[PlanJob]
) -> CapacityPlan:
    """Check every group; a group without jobs fits trivially."""
    by_node = {node.name: node for node in nodes}
    known_groups = {group.name for group in groups}
    for job in jobs:
        if job.group not in known_groups:
            raise InvalidArgumentError(f"job {job.name!r} names unknown group {job.group!r}")
    return CapacityPlan(tuple(_plan_group(g, by_node, jobs) for g in groups))


def _plan_group(
    group: PlanGroup, by_node: Mapping[str, NodeSpec], all_jobs: Sequence[PlanJob]
) -> GroupPlan:
    missing = [name for name in group.nodes if name not in by_node]
    if missing or not group.nodes:
        raise InvalidArgumentError(f"group {group.name!r} names unknown nodes: {missing}")
    members = [by_node[name] for name in group.nodes]
    gpus = sum(node.gpus for node in members)
    usable = min(node.gpu_memory_bytes for node in members) - group.headroom_bytes
    bandwidth = min(node.host_device_bytes_per_s for node in members)
    footprints = [_footprint(j, gpus) for j in all_jobs if j.group == group.name]
    problems = [
        f"job {f.name} needs {human_bytes(f.peak_bytes)} per GPU in phase "
        f"{f.peak_phase}; a GPU offers {human_bytes(usable)} after headroom"
        for f in footprints
        if f.peak_bytes > usable
    ]
    host = _host_needs(group, members, footprints, problems)
    pairs = tuple(
        (a.name, b.name)
        for a, b in combinations(footprints, 2)
        if a.peak_bytes + b.peak_bytes <= usable
    )
    if problems:
        verdict = FitVerdict(False, "; ".join(problems))
    else:
        peak = max((f.peak_bytes for f in footprints), default=0)
        verdict = FitVerdict(
            True,
            f"{len(footprints)} job(s) fit: peak {human_bytes(peak)} per GPU of {human_bytes(usable)}",
        )
    return GroupPlan(
        name=group.name,
        verdict=verdict,
        problems=tuple(problems),
        jobs=tuple(footprints),
        usable_gpu_bytes=usable,
        host_bytes=host,
        coresident_pairs=pairs,
        all_coresident=sum(f.peak_bytes for f in footprints) <= usable,
        switch_seconds=_switch_seconds(footprints, pairs, group.switch_overhead_s, bandwidth),
    )


def _footprint(job: PlanJob, gpus: int) -> JobFootprint:
    """The job's bytes per GPU in each phase, over its shards (every GPU by default)."""
    totals = peak_memory({name: list(parts) for name, parts in job.phases.items()})
    shards = job.shards or gpus
    per_gpu = {
        name: ideal_sharded_memory(total, shards) for name, total in totals.phase_totals.items()
    }
    return JobFootprint(job.name, per_gpu, totals.phase, per_gpu[totals.phase])


def _host_needs(
    group: PlanGroup,
    members: Sequence[NodeSpec],
    footprints: Sequence[JobFootprint],
    problems: list[str],
) -> dict[str, tuple[int, int]]:
    """Per node: (needed, available) host bytes to park every job; a shortfall joins `problems`."""
    host: dict[str, tuple[int, int]] = {}
    for node in members:
        parked = [f.peak_bytes * node.gpus for f in footprints]
        verdict = host_capacity_verdict(
            parked[:-1],
            parked[-1] if parked else 0,
            node.host_memory_bytes,
            group.host_reserve_bytes,
        )
        host[node.name] = (sum(parked) + group.host_reserve_bytes, node.host_memory_bytes)
        if not verdict.fits:
            problems.append(f"node {node.name}: parking every job of the group: {verdict.reason}")
    return host


def _switch_seconds(
    footprints: Sequence[JobFootprint],
    pairs: tuple[tuple[str, str], ...],
    overhead_s: float,
    bandwidth: float,
) -> dict[tuple[str, str], float]:
    """(outgoing, incoming) -> seconds of the switch; 0 for a pair that can be co-resident."""
    switches = {}
    for a in footprints:
        for b in footprints:
            if a is not b:
                together = (a.name, b.name) in pairs or (b.name, a.name) in pairs
                switches[(a.name, b.name)] = (
                    0.0 if together else overhead_s + (a.peak_bytes + b.peak_bytes) / bandwidth
                )
    return switches


def _gib(where: str, data: Mapping[str, object], key: str, default: float | None = None) -> int:
    if key not in data and default is None:
        raise InvalidArgumentError(f"{where}.{key} is required")
    return round(_checks.real(f"{where}.{key}", data.get(key, default), minimum=0) * BYTES_PER_GIB)


_KV_FIELDS = frozenset(
    {
        "num_sequences",
        "tokens_per_sequence",
        "num_layers",
        "num_kv_heads",
        "head_dim",
        "element_bytes",
    }
)


def _job_phases(where: str, job: Mapping[str, object]) -> dict[str, tuple[int, ...]]:
    """Whole-job bytes per phase: rollout, training, weight publication (or explicit GiB)."""
    explicit = job.get("phases_gib")
    if explicit is not None:
        if not isinstance(explicit, Mapping) or not explicit:
            raise InvalidArgumentError(f"{where}.phases_gib must be a mapping phase -> [GiB, ...]")
        return {
            str(name): tuple(
                round(v * BYTES_PER_GIB)
                for v in _checks.reals(f"{where}.phases_gib.{name}", parts, minimum=0)
            )
            for name, parts in explicit.items()
        }
    widths = job.get("bytes", {})
    if not isinstance(widths, Mapping):
        raise InvalidArgumentError(f"{where}.bytes must be a mapping")
    state = model_state_bytes(
        job.get("total_parameters"),  # type: ignore[arg-type]  # checked inside
        job.get("trainable_parameters"),  # type: ignore[arg-type]
        parameter_bytes=widths.get("parameter", 2),
        gradient_bytes=widths.get("gradient", 2),
        optimizer_state_bytes=widths.get("optimizer_state", 8),
        master_parameter_bytes=widths.get("master_parameter", 4),
    )
    kv_spec = job.get("kv_cache", {})
    if not isinstance(kv_spec, Mapping):
        raise InvalidArgumentError(f"{where}.kv_cache must be a mapping")
    unknown = sorted(set(kv_spec) - _KV_FIELDS)
    if unknown or (kv_spec and set(kv_spec) != _KV_FIELDS):
        raise InvalidArgumentError(
            f"{where}.kv_cache needs exactly {', '.join(sorted(_KV_FIELDS))}; got {', '.join(sorted(kv_spec))}"
        )
    kv = kv_cache_bytes(**kv_spec) if kv_spec else 0
    activations = _gib(where, job, "activations_gib", 0.0)
    buffers = _gib(where, job, "buffers_gib", 0.0)
    weights = state.parameter_bytes_total
    return {
        "rollout": (weights, kv, buffers),
        "training": (state.total_bytes, activations, buffers),
        "weight publication": (weights, weights, buffers),
    }


def plan_from_mapping(data: object) -> CapacityPlan:
    """Parse the YAML layout described in docs/planner.md and plan it."""
    if not isinstance(data, Mapping):
        raise InvalidArgumentError("plan must be a mapping with nodes, groups and jobs")
    nodes = [_node_spec(where, raw) for where, raw in _entries(data, "nodes")]
    if not nodes:
        raise InvalidArgumentError("nodes must list at least one node")
    every_node = [node.name for node in nodes]
    groups = [_group_spec(where, raw, every_node) for where, raw in _entries(data, "groups")]
    if not groups:
        raise InvalidArgumentError("groups must list at least one group")
    jobs = [_job_spec(where, raw, groups[0].name) for where, raw in _entries(data, "jobs")]
    return plan_capacity(nodes, groups, jobs)


def _entries(data: Mapping[str, Any], key: str) -> list[tuple[str, Mapping[str, object]]]:
    """The mappings listed under `key`, each with where it stands (`nodes[0]`)."""
    entries = []
    for i, raw in enumerate(data.get(key) or []):
        where = f"{key}[{i}]"
        if not isinstance(raw, Mapping):
            raise InvalidArgumentError(f"{where} must be a mapping")
        entries.append((where, raw))
    return entries


def _node_spec(where: str, raw: Mapping[str, object]) -> NodeSpec:
    return NodeSpec(
        name=_checks.name(f"{where}.name", raw.get("name")),
        gpus=_checks.integer(f"{where}.gpus", raw.get("gpus", 1), minimum=1),
        gpu_memory_bytes=_gib(where, raw, "gpu_memory_gib"),
        host_memory_bytes=_gib(where, raw, "host_memory_gib"),
        host_device_bytes_per_s=_checks.real(
            f"{where}.host_device_gb_per_s", raw.get("host_device_gb_per_s", 25.0), positive=True
        )
        * 1e9,
    )


def _group_spec(where: str, raw: Mapping[str, object], every_node: list[str]) -> PlanGroup:
    listed = raw.get("nodes") or every_node
    if isinstance(listed, str) or not isinstance(listed, Sequence):
        raise InvalidArgumentError(f"{where}.nodes must be a list of node names")
    return PlanGroup(
        name=_checks.name(f"{where}.name", raw.get("name")),
        nodes=tuple(str(n) for n in listed),
        headroom_bytes=_gib(where, raw, "headroom_gib", 0.0),
        host_reserve_bytes=_gib(where, raw, "host_reserve_gib", 0.0),
        switch_overhead_s=_checks.real(
            f"{where}.switch_overhead_s", raw.get("switch_overhead_s", 0.5), minimum=0
        ),
    )


def _job_spec(where: str, raw: Mapping[str, object], first_group: str) -> PlanJob:
    shards = raw.get("shards")
    return PlanJob(
        name=_checks.name(f"{where}.name", raw.get("name")),
        group=_checks.name(f"{where}.group", raw.get("group", first_group)),
        phases=_job_phases(where, raw),
        shards=None if shards is None else _checks.integer(f"{where}.shards", shards, minimum=1),
    )
