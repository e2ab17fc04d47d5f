"""Move planning: which jobs leave the GPUs and which moves each node runs. Pure.

The coordinator asks every node of the group for a report (device memory free, where each
of the group's jobs stands), turns the answers into `NodeReport`s and executes the plan
these functions return; a node that did not answer is `answered=False`.

- `plan_switch`: the jobs a switch evicts (`must_evict`, then resident candidates least
  recently used first, only while the incoming job does not fit; every candidate when a
  node is silent or the incoming job's size is unknown) and, per node, the snapshots and
  the restore to run. A switch resumed after a restart finds some jobs parked already:
  they count as evicted.
- `plan_park`: the snapshots that park a prefetched waiter again once it left.
- `plan_prefetch`: the same for restoring the head waiter beside the holder before the
  holder yields. The holder is never evicted for it; other resident jobs are, LRU first,
  only when that makes the waiter fit. What the holder declared but does not hold yet
  (a job granted before it allocates) counts as taken. No plan (None) when it cannot fit,
  when a node is silent, or when nothing is parked: a prefetch never moves blind.
- `evicts_every_candidate`: whether no candidate can stay beside the incoming job (then
  a switch planned over silent nodes is the same plan; the coordinator skips a Status
  round on it), and `on_devices`: which jobs those reports found on a device, so that
  such a plan leaves out a parked candidate (its agent would refuse a second snapshot).

Partial moves (issue 26): a candidate that declared its parts (`JobSpec.parts`, passed as
`parts`) and was chosen to make room is planned part by part on each node where it runs
(`core.parts.plan_parts`): only the parts the incoming job needs room for leave, discards
first, and `NodeMoves.partial` says which tags to discard and which to offload. It still
counts as evicted (the scheduler has it parked); its other parts stay on the device. A job
that declared nothing, one that must go (preempted, fenced), one on a silent node, and one
whose parts cannot make room there move whole, as before. Prefetches move whole jobs.

A job's bytes are taken as spread evenly over a node's devices, so it fits only where the
fullest device has room for its share: summing free memory over devices would restore a job
beside another that fills its device.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from rlslice.config import StatePart
from rlslice.scheduler.core.parts import PartPlan, plan_parts
from rlslice.scheduler.core.residency import NodeMemory, choose_evictions


class Place(enum.StrEnum):
    """Where a job stands on one node, as its agent reports it."""

    RUNNING = "running"
    SAVING = "saving"
    PARKED = "parked"
    RESTORING = "restoring"
    FAULTED = "faulted"


_IN_HOST = {Place.PARKED, Place.FAULTED, Place.RESTORING}


@dataclass(frozen=True, slots=True)
class JobReport:
    """One of the group's jobs on one node."""

    place: Place
    device_bytes: int = 0
    """Device bytes it holds there now."""
    host_bytes: int = 0
    """Host bytes its parked state takes there."""


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What one node's agent said (or that it said nothing)."""

    node: str
    answered: bool = True
    device_free: tuple[int, ...] = ()
    """Free bytes of each device."""
    jobs: Mapping[str, JobReport] = field(default_factory=dict)
    """The group's jobs known there."""
    host_free_bytes: int | None = None
    """Host memory free for parked state there (None: unknown, taken as no limit)."""

    @property
    def free_bytes(self) -> int:
        """Free bytes usable by one job spread over the devices (see the module docstring)."""
        return len(self.device_free) * min(self.device_free) if self.device_free else 0


@dataclass(frozen=True, slots=True)
class NodeMoves:
    """The moves of one node: snapshots of `snapshot`, then (or meanwhile) restore."""

    node: str
    snapshot: tuple[str, ...] = ()
    restore: str | None = None
    partial: Mapping[str, PartPlan] = field(default_factory=dict)
    """Snapshotted jobs that move only some of their parts here: job -> the plan (its
    `discard` and `offload` tags). A job of `snapshot` not listed moves whole."""


@dataclass(frozen=True, slots=True)
class MovePlan:
    """What a switch (or prefetch) does."""

    evict: tuple[str, ...]
    """Jobs that end up parked (snapshotted, or found parked already)."""
    nodes: tuple[NodeMoves, ...]
    """Nodes with something to do, in the group's node order."""

    @property
    def moves(self) -> int:
        """Number of snapshot and restore calls."""
        return sum(len(n.snapshot) + (n.restore is not None) for n in self.nodes)


@dataclass(frozen=True, slots=True)
class Need:
    """The incoming job: who it is and what the scheduler knows of its size."""

    job: str
    declared_bytes: int = 0
    """Device bytes per node the job declared at registration (0: unknown)."""
    restore: bool = True
    """Whether the scheduler has it parked (or faulted): restore it where a silent node
    might hold it."""
    discard_bytes: int = 0
    """The bytes of the `discard` parts it declared, per node. Parked, it needs room for
    them beside its parked bytes: a partial snapshot freed them without a copy, and they
    come back (rebuilt) with the job. Counted whether or not they were discarded (the
    agents report a parked job's host bytes only): a plan errs on the side of room."""


def plan_switch(
    need: Need,
    reports: Sequence[NodeReport],
    candidates: Sequence[str],
    *,
    must_evict: Sequence[str] = (),
    headroom_bytes: int = 0,
    parts: Mapping[str, Sequence[StatePart]] | None = None,
) -> MovePlan:
    """The moves of a switch to `need.job`; see the module docstring. `parts`: the parts
    each job declared (a job not listed, or listed with none, moves whole)."""
    everyone = (*must_evict, *(j for j in candidates if j not in must_evict))
    chosen, _ = _evictions(need, reports, candidates, must_evict, headroom_bytes)
    evict = everyone if chosen is None else chosen
    # A switch resumed after a restart finds some jobs parked already: evicted all the same.
    evict += tuple(j for j in everyone if j not in evict and _parked_somewhere(reports, j))
    nodes = _node_moves(need, reports, evict)
    if chosen is not None and parts:
        splittable = {j: p for j, p in parts.items() if p and j in chosen and j not in must_evict}
        by_node = {r.node: r for r in reports}
        nodes = tuple(_split(m, by_node[m.node], need, splittable, headroom_bytes) for m in nodes)
    return MovePlan(evict, nodes)


def plan_prefetch(
    need: Need,
    reports: Sequence[NodeReport],
    candidates: Sequence[str],
    *,
    holder: str | None,
    headroom_bytes: int = 0,
    holder_declared_bytes: int = 0,
) -> MovePlan | None:
    """The moves that restore `need.job` beside `holder` now, or None; see the docstring."""
    if not reports or not all(r.answered for r in reports):
        return None
    if holder is not None and holder_declared_bytes:
        reports = [_reserve(r, holder, holder_declared_bytes) for r in reports]
    if not any(_in_host(r, need.job) for r in reports):
        # Nothing parked. On the devices already (a prefetch resumed after a restart
        # whose restores had finished): done, with nothing to move; else nothing to do.
        running = any(_place(r, need.job) is Place.RUNNING for r in reports)
        return MovePlan((), ()) if running else None
    allowed = [j for j in candidates if j not in (holder, need.job)]
    chosen, fit = _evictions(need, reports, allowed, (), headroom_bytes)
    if chosen is None or not fit:
        return None
    return MovePlan(chosen, _node_moves(need, reports, chosen))


def evicts_every_candidate(
    need: Need,
    reports: Sequence[NodeReport],
    candidates: Sequence[str],
    *,
    headroom_bytes: int = 0,
) -> bool:
    """Whether a switch to `need.job` planned from `reports` would evict every one of
    `candidates` (least recently used first): none can stay beside it, on some node, with
    every node's answer and the job's size known.

    Then the switch's plan does not depend on the numbers: evicting every candidate is
    what a plan made with no report at all does (`plan_switch` over silent nodes), so a
    coordinator that learnt this moments ago may plan the switch without asking again.
    Evicting more is never unsafe, only slower: a job that has shrunk since could have
    stayed."""
    if not candidates or not reports:
        return False
    chosen, _ = _evictions(need, reports, candidates, (), headroom_bytes)
    return chosen is not None and set(candidates) <= set(chosen)


def on_devices(reports: Sequence[NodeReport], jobs: Sequence[str]) -> frozenset[str]:
    """Those of `jobs` that some node of `reports` has on its devices (running, saving),
    or that a node did not answer about: every job but the ones parked (or faulted,
    restoring) wherever they are known."""
    return frozenset(
        job
        for job in jobs
        if any(not r.answered or (_place(r, job) or Place.PARKED) not in _IN_HOST for r in reports)
    )


def _reserve(report: NodeReport, holder: str, declared: int) -> NodeReport:
    """`report` with what `holder` declared but does not hold there yet taken off its
    devices (spread evenly, as a job's bytes are taken to be)."""
    held = report.jobs.get(holder)
    missing = declared - (held.device_bytes if held is not None else 0)
    if missing <= 0 or not report.device_free:
        return report
    share = -(-missing // len(report.device_free))
    return replace(report, device_free=tuple(max(0, f - share) for f in report.device_free))


def plan_park(job: str, reports: Sequence[NodeReport]) -> MovePlan:
    """The snapshots that park `job` again (a prefetched waiter that left)."""
    nodes = tuple(NodeMoves(r.node, (job,)) for r in reports if _needs_snapshot(r, job))
    return MovePlan((job,), nodes)


def _evictions(
    need: Need,
    reports: Sequence[NodeReport],
    candidates: Sequence[str],
    must_evict: Sequence[str],
    headroom: int,
) -> tuple[tuple[str, ...] | None, bool]:
    """(jobs to evict, whether the incoming job then fits); None when unknown."""
    wanted: dict[str, int] = {}
    memory = []
    for report in reports:
        if not report.answered:
            return None, False
        needed = _wanted(need, report)
        if needed is None:
            return None, False  # how much the incoming job needs is unknown
        wanted[report.node] = needed
        resident = {job: r.device_bytes for job, r in report.jobs.items()}
        memory.append(NodeMemory(report.node, report.free_bytes, resident))
    chosen = choose_evictions(
        wanted, memory, candidates, must_evict=must_evict, headroom_bytes=headroom
    )
    freed = {m.node: sum(m.job_bytes.get(j, 0) for j in chosen) for m in memory}
    fit = all(wanted.get(m.node, 0) + headroom <= m.free_bytes + freed[m.node] for m in memory)
    return chosen, fit


def _split(
    moves: NodeMoves,
    report: NodeReport,
    need: Need,
    parts: Mapping[str, Sequence[StatePart]],
    headroom: int,
) -> NodeMoves:
    """`moves` with the jobs of `parts` planned part by part, in eviction order: each frees
    only what the incoming job still lacks there; one whose parts cannot make room (or whose
    plan does not fit) moves whole, and the next job is planned with its bytes freed."""
    wanted = _wanted(need, report)
    if wanted is None or not any(j in parts for j in moves.snapshot):
        return moves
    target = wanted + headroom
    free = report.free_bytes
    host = report.host_free_bytes
    partial: dict[str, PartPlan] = {}
    for job in moves.snapshot:
        held = report.jobs[job].device_bytes if job in report.jobs else 0
        if job in parts:
            plan = plan_parts(parts[job], target, free, host_free_bytes=host)
            if plan.fits:
                partial[job] = plan
                free += plan.bytes_freed
                host = None if host is None else host - plan.bytes_copied
                continue
        free += held
        host = None if host is None else max(0, host - held)
    return replace(moves, partial=partial) if partial else moves


def _wanted(need: Need, report: NodeReport) -> int | None:
    """Device bytes the incoming job still needs on the node of `report`; None: unknown."""
    mine = report.jobs.get(need.job)
    if mine is not None and mine.place is Place.RUNNING:
        # On the device already (a switch resumed after its restore finished, or a job
        # that allocated before it first acquired): what it holds there counts in the
        # used memory; only the rest of what it declared is still needed.
        return max(0, need.declared_bytes - mine.device_bytes)
    if mine is not None and mine.place in _IN_HOST:
        return mine.host_bytes + need.discard_bytes
    return need.declared_bytes or None


def _node_moves(
    need: Need, reports: Sequence[NodeReport], evict: Sequence[str]
) -> tuple[NodeMoves, ...]:
    planned = []
    for report in reports:
        snapshot = tuple(j for j in evict if _needs_snapshot(report, j))
        restore = need.job if _needs_restore(report, need) else None
        if snapshot or restore:
            planned.append(NodeMoves(report.node, snapshot, restore))
    return tuple(planned)


def _needs_snapshot(report: NodeReport, job: str) -> bool:
    """A silent node gets the call anyway (it fails, or finds nothing to do)."""
    if not report.answered:
        return True
    found = report.jobs.get(job)
    return found is not None and found.place is not Place.PARKED


def _needs_restore(report: NodeReport, need: Need) -> bool:
    if not report.answered:
        return need.restore
    return _in_host(report, need.job)


def _in_host(report: NodeReport, job: str) -> bool:
    found = report.jobs.get(job)
    return found is not None and found.place in _IN_HOST


def _parked_somewhere(reports: Sequence[NodeReport], job: str) -> bool:
    return any(
        (found := r.jobs.get(job)) is not None and found.place is Place.PARKED for r in reports
    )


def _place(report: NodeReport, job: str) -> Place | None:
    found = report.jobs.get(job)
    return found.place if found is not None else None
