"""Which spec changes a group takes while state sits on its nodes. Pure.

A parked job's copy lives on the nodes of its group, taken by the group's backend, and its
processes stay frozen there until the restore. A change that moves where (`nodes`,
`node_selector`) or how (`backend`, `backend_options`, a job's own `backend`) state is
moved would restore nothing on the new nodes while the old ones keep the copy and the frozen
worker, so it is refused while any job is off its devices or being moved:

- parked or faulted (its copy in host memory, on the old nodes);
- part of the switch in flight (incoming, evicted, eviction candidate);
- preempted or awaiting its fence (its next move runs on the old nodes).

Removing a job from `jobs` while it is so placed is refused too (its backend and scheduling
inputs would change under its parked copy). Everything else (policy, per-job priority and
weight, leases, hold limits, headroom) moves no state and is taken at once. A resident job's
state is on its own devices (home): nothing of it waits for a restore, so it does not block.

The same rule keeps a group's effective nodes (a selector resolved against agents' labels)
while state is on them: `node_change_refusal`.
"""

from __future__ import annotations

from collections.abc import Iterable

from rlslice._nodes import node_label
from rlslice.config import GroupSpec
from rlslice.scheduler.core.state import GroupState


def jobs_off_device(state: GroupState) -> dict[str, str]:
    """Job -> where it stands, for every job whose state is not home on its devices or is
    being moved (first parked first, then the rest by name)."""
    where: dict[str, str] = {}
    for job in state.parked:
        where[job] = "parked"
    for job in sorted(state.faulted):
        where.setdefault(job, "faulted")
    switch = state.switch
    if switch is not None:
        for job in sorted({switch.incoming, *switch.evict, *switch.candidates}):
            where.setdefault(job, "mid-switch")
    for job in sorted(state.preempted):
        where.setdefault(job, "preempted")
    for job in state.fencing:
        where.setdefault(job, "awaiting its fence")
    return where


def _named(where: dict[str, str], jobs: Iterable[str]) -> str:
    return ", ".join(f"{job!r} ({where[job]})" for job in jobs)


def _backend(spec: GroupSpec, job: str) -> str:
    return spec.job(job).backend or spec.backend


def spec_change_refusal(old: GroupSpec, new: GroupSpec, state: GroupState) -> str | None:
    """Why `new` may not replace `old` for `state`'s group now, in one line; None: it may."""
    where = jobs_off_device(state)
    if not where:
        return None
    jobs = list(where)
    blocking = _named(where, jobs)
    after = "; retry once they are restored or have left"
    moved = [
        name
        for name, changed in (
            ("nodes", {node_label(n) for n in old.nodes} != {node_label(n) for n in new.nodes}),
            ("node_selector", old.node_selector != new.node_selector),
            ("backend", old.backend != new.backend),
            ("backend_options", old.backend_options != new.backend_options),
        )
        if changed
    ]
    if moved:
        return f"spec.{moved[0]}: cannot change while job(s) {blocking} keep state on the old nodes{after}"
    listed_before = {spec.name for spec in old.jobs}
    listed_now = {spec.name for spec in new.jobs}
    removed = [job for job in jobs if job in listed_before - listed_now]
    if removed:
        return f"spec.jobs: cannot remove job(s) {_named(where, removed)} while their state is off their devices{after}"
    rebacked = [job for job in jobs if _backend(old, job) != _backend(new, job)]
    if rebacked:
        return f"spec.jobs[].backend: cannot change for job(s) {_named(where, rebacked)} while their state is off their devices{after}"
    return None


def node_change_refusal(
    state: GroupState, old_nodes: Iterable[str], new_nodes: Iterable[str]
) -> str | None:
    """Why `state`'s group must keep `old_nodes` rather than take `new_nodes` (its
    selector now resolves differently), in one line; None: it may take them."""
    old, new = set(old_nodes), set(new_nodes)
    if not old or old == new:  # no node held anything
        return None
    where = jobs_off_device(state)
    if not where:
        return None
    return (
        f"group {state.name!r} keeps nodes {sorted(old)} (not {sorted(new)}) while job(s) "
        f"{_named(where, where)} keep state on them"
    )
