"""A spec change that would move where or how a job's state is moved is refused while that
state is off its devices; everything else is taken at once (the pure core).

Table: (spec change kind) x (placement of job a). The kinds that move state (nodes,
node_selector, backend, backend_options, a's own backend, removing a from `jobs`) are
refused with FAILED_PRECONDITION naming the field and job a while a is parked, faulted,
mid-switch or preempted; taken while a is idle or resident (its state home). Policy and a
listed job's priority/weight move nothing: always taken. A refusal leaves the state as it
was. A re-resolved selector keeps the old nodes while state is on them.

Also: a job the admin listed takes the spec's priority and weight over Register's, at
Register and at every later PutGroup; an unlisted job keeps Register's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from rlslice._errors import FailedPreconditionError
from rlslice.config import GroupSpec, JobSpec, Policy
from rlslice.scheduler.core import GroupState, JobRecord, Switch, events, step
from rlslice.scheduler.core.placement import place
from rlslice.scheduler.core.spec_change import node_change_refusal, spec_change_refusal

from .conftest import Driver

OLD = GroupSpec(
    name="g",
    nodes=("n1", "n2"),
    node_selector={"pool": "x"},
    backend="sim",
    jobs=(JobSpec(name="a", priority=1), JobSpec(name="b")),
)


def _record(job: str) -> JobRecord:
    return JobRecord(job, f"lease-{job}", "hash", 30.0, 2000.0)


def _switch(**kw: Any) -> Switch:
    fields: dict[str, Any] = {
        "incoming": "b", "ticket": 1, "waited_since": 0.0, "evict": (), "candidates": ("a",),
        "restore": False, "epoch": 3, "rollback_epoch": 4, "attempt": 1, "started_at": 0.0,
    }  # fmt: skip
    fields.update(kw)
    return Switch(**fields)


PLACEMENTS: dict[str, Callable[[], GroupState]] = {
    "idle": lambda: GroupState(OLD),
    "holding": lambda: GroupState(OLD, holder="a", placement=place(("a",))),
    "resident": lambda: GroupState(OLD, holder="b", placement=place(("a", "b"))),
    "parked": lambda: GroupState(OLD, holder="b", placement=place(("b",), ("a",))),
    "faulted": lambda: GroupState(OLD, placement=place(faulted={"a": "restore failed"})),
    "mid-switch": lambda: GroupState(OLD, placement=place(("a",)), switch=_switch()),
    "preempted": lambda: GroupState(
        OLD, placement=place(parked=("a",)), preempted=frozenset({"a"})
    ),
}
OFF_DEVICE = {"parked", "faulted", "mid-switch", "preempted"}

CHANGES: dict[str, tuple[dict[str, Any], str | None]] = {
    # kind: (spec fields replaced, the field a refusal names; None: never refused)
    "nodes": ({"nodes": ("n1", "n3")}, "spec.nodes"),
    "node_selector": ({"node_selector": {"pool": "y"}}, "spec.node_selector"),
    "backend": ({"backend": "cuda"}, "spec.backend"),
    "backend_options": ({"backend_options": {"spill": "/x"}}, "spec.backend_options"),
    "a's backend": ({"jobs": (JobSpec(name="a", backend="app"), JobSpec(name="b"))}, "backend"),
    "a removed from jobs": ({"jobs": (JobSpec(name="b"),)}, "spec.jobs"),
    "policy": ({"policy": Policy.FAIR}, None),
    "a's priority and weight": (
        {"jobs": (JobSpec(name="a", priority=9, weight=3), JobSpec(name="b"))},
        None,
    ),
    "hold limits and headroom": ({"max_hold_seconds": 5.0, "headroom_bytes": 1}, None),
    "nodes reordered": ({"nodes": ("n2", "n1")}, None),
}


def _with_registered(state: GroupState) -> GroupState:
    return GroupState(
        state.spec,
        jobs={"a": _record("a"), "b": _record("b")},
        holder=state.holder,
        placement=state.placement,
        switch=state.switch,
        preempted=state.preempted,
    )


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("kind", list(CHANGES))
def test_a_spec_change_is_refused_only_when_it_moves_state_that_is_off_its_devices(
    kind: str, placement: str
) -> None:
    fields, field_named = CHANGES[kind]
    state = _with_registered(PLACEMENTS[placement]())
    new = OLD.model_copy(update=fields)
    reason = spec_change_refusal(OLD, new, state)
    refused = field_named is not None and placement in OFF_DEVICE
    if not refused:
        assert reason is None
        after = step(state, events.PutGroup(new), 1000.0).state
        assert after is not None
        assert after.spec == new
        return
    assert reason is not None
    assert "\n" not in reason
    assert field_named in reason
    assert "'a'" in reason
    assert field_named is not None
    with pytest.raises(FailedPreconditionError, match=re.escape(field_named)):
        step(state, events.PutGroup(new), 1000.0)


def test_a_refused_put_group_changes_nothing_and_a_later_one_is_taken(
    new: Callable[..., Driver],
) -> None:
    d = new(nodes=("n1", "n2"))
    d.register("a")
    d.register("b")
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    d.apply(events.Yield("a"))
    d.finish_switch()  # b holds; a is parked on n1, n2
    before = d.state
    moved = GroupSpec(name="g", nodes=("n3",))
    with pytest.raises(FailedPreconditionError, match=r"spec\.nodes.*'a' \(parked\)"):
        d.apply(events.PutGroup(moved))
    assert d.state is before
    d.acquire("a")
    d.apply(events.Yield("b"))
    switch = d.state.switch
    assert switch is not None
    assert switch.restore
    assert switch.incoming == "a"
    with pytest.raises(FailedPreconditionError, match="mid-switch"):
        d.apply(events.PutGroup(moved))
    d.finish_switch()  # a holds again; b parked now
    d.apply(events.Unregister("b"))  # b leaves: its state is released, nothing is off-device
    d.apply(events.PutGroup(moved))
    assert d.state.spec.nodes == ("n3",)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_a_selector_resolved_to_other_nodes_keeps_the_old_ones_while_state_is_on_them(
    placement: str,
) -> None:
    state = _with_registered(PLACEMENTS[placement]())
    reason = node_change_refusal(state, ("n1", "n2"), ("n1",))
    if placement in OFF_DEVICE:
        assert reason is not None
        assert "['n1', 'n2']" in reason
        assert "'a'" in reason
    else:
        assert reason is None
    assert node_change_refusal(state, ("n1", "n2"), ("n2", "n1")) is None
    assert node_change_refusal(state, (), ("n1",)) is None  # no node held anything


def test_a_listed_job_takes_the_admins_priority_and_weight_over_registers(
    new: Callable[..., Driver],
) -> None:
    d = new(policy=Policy.PRIORITY, jobs=(JobSpec(name="a", priority=5, weight=2.0),))
    d.register("a", priority=100, weight=9.0)
    d.register("b", priority=7, weight=3.0)
    assert (d.state.jobs["a"].priority, d.state.jobs["a"].weight) == (5, 2.0)
    assert (d.state.jobs["b"].priority, d.state.jobs["b"].weight) == (7, 3.0)
    d.apply(
        events.PutGroup(
            GroupSpec(
                name="g",
                policy=Policy.PRIORITY,
                jobs=(JobSpec(name="a", priority=-3, weight=4.0), JobSpec(name="b", priority=1)),
            )
        )
    )
    assert (d.state.jobs["a"].priority, d.state.jobs["a"].weight) == (-3, 4.0)
    assert (d.state.jobs["b"].priority, d.state.jobs["b"].weight) == (1, 1.0)
