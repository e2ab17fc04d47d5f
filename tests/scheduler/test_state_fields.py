"""Every field of a group's state survives each place that copies it field by field: the
store codec, the event ring and (as far as it carries it) the wire.

Cases: a state whose every field (and every field of its job records, waiters and switch)
differs from the default survives encode/decode and a trip through the ring, equal field
for field; the wire shows each field it carries, and every state and job field is either
carried or listed as left out on purpose; the built state does set every field, so a new
field makes this test fail until it is carried (the case that once lost `prefetched`,
`unfit` and `acknowledged` from the ring).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rlslice.config import GroupSpec, JobSpec, Policy
from rlslice.scheduler import _proto
from rlslice.scheduler._runtime import EventRing
from rlslice.scheduler.core import GroupState, JobRecord, Switch, SwitchKind, Waiter
from rlslice.scheduler.core.placement import place
from rlslice.scheduler.store.codec import decode_group, encode_group
from rlslice.v1alpha1 import scheduler_pb2 as pb


def _full_state() -> GroupState:
    spec = GroupSpec(
        name="g",
        policy=Policy.FAIR,
        max_hold_seconds=30,
        nodes=("n1", "n2"),
        jobs=(JobSpec(name="a", weight=2.0),),
    )
    jobs = {
        n: JobRecord(
            name=n,
            lease_id=f"l{n}",
            secret_hash="hash",
            lease_seconds=30.0,
            expires_at=1e9 + i,
            priority=i + 1,
            weight=1.5,
            device_bytes=9 + i,
            held_seconds=2.5 + i,
            session=f"s{n}",
            last_served_at=100.0 + i,
            phase="rollout",
            lock_only=True,
            discarded=("kv_cache",),
            told_discarded=("graphs",),
            parked_parts=("optimizer", f"w{n}"),
        )
        for i, n in enumerate("abcde")
    }
    switch = Switch(
        incoming="b",
        ticket=5,
        waited_since=9.0,
        evict=("e",),
        candidates=("x",),
        restore=True,
        epoch=6,
        rollback_epoch=7,
        attempt=2,
        started_at=12.0,
        preempted="e",
        preempted_since=3.0,
        phase="train",
        detached=True,
        purpose=SwitchKind.PREFETCH,
        fence=("e",),
    )
    return GroupState(
        spec=spec,
        jobs=jobs,
        holder="e",
        holder_since=11.0,
        queue=(Waiter("c", 3, 10.0, "train", attached=False), Waiter("d", 4, 11.0)),
        placement=place(("b", "e"), ("a",), {"d": "restore failed", "c": "no room"}),
        epoch=7,
        switch=switch,
        yield_requested_at=13.0,
        preempted=frozenset({"e", "a"}),
        switches=4,
        last_switch_seconds=0.25,
        last_switch_at=12.5,
        prefetched=("b",),
        unfit=("e", "c"),
        fencing=("e",),
        acknowledged=("e", 7),
    )


def _defaults(cls: type[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _assert_non_default(obj: object) -> None:
    for name, default in _defaults(type(obj)).items():
        assert getattr(obj, name) != default, f"{type(obj).__name__}.{name} is its default"


def _assert_same(got: GroupState, want: GroupState) -> None:
    for name in GroupState.__slots__:
        assert getattr(got, name) == getattr(want, name), name
    assert got == want
    if got.switch is not None:
        assert type(got.switch.purpose) is SwitchKind


def test_the_full_state_sets_every_field_to_something_other_than_its_default() -> None:
    state = _full_state()
    _assert_non_default(state)
    assert state.switch is not None
    _assert_non_default(state.switch)
    for record in state.jobs.values():
        _assert_non_default(record)
    for name in ("resident", "parked", "faulted"):
        assert getattr(state, name), name
    assert not state.queue[0].attached
    assert state.queue[0].phase


def test_every_field_survives_the_store_codec() -> None:
    state = _full_state()
    _assert_same(decode_group(encode_group(state)), state)


def test_every_field_survives_the_event_ring() -> None:
    state = _full_state()
    ring = EventRing(4)
    ring.add(1, 50.0, "grant", "e", "detail", 0.5, 10, state)
    ring.add(2, 51.0, "yield", "e", "", 0.0, 0, GroupState(state.spec))
    first, second = list(ring)
    _assert_same(first.state, state)
    assert (first.seq, first.time, first.kind, first.job, first.detail) == (
        1,
        50.0,
        "grant",
        "e",
        "detail",
    )
    assert (first.seconds, first.bytes, first.group) == (0.5, 10, "g")
    _assert_same(second.state, GroupState(state.spec))


def test_every_state_and_job_field_is_carried_by_the_wire_or_left_out_on_purpose() -> None:
    assert set(_proto.WIRE_CARRIES) | set(_proto.WIRE_OMITS) == set(GroupState.__slots__)
    assert not set(_proto.WIRE_CARRIES) & set(_proto.WIRE_OMITS)
    assert set(_proto.JOB_WIRE_CARRIES) | set(_proto.JOB_WIRE_OMITS) == set(JobRecord.__slots__)
    assert not set(_proto.JOB_WIRE_CARRIES) & set(_proto.JOB_WIRE_OMITS)
    status_fields = set(pb.GroupStatus.DESCRIPTOR.fields_by_name)
    job_fields = set(pb.JobStatus.DESCRIPTOR.fields_by_name)
    for shown in _proto.WIRE_CARRIES.values():
        for name in shown:
            top, _, sub = name.partition(".")
            assert top in status_fields, name
            assert not sub or sub in job_fields, name
    assert set(_proto.JOB_WIRE_CARRIES.values()) <= job_fields


def test_the_wire_shows_each_field_it_carries() -> None:
    state = _full_state()
    status = _proto.group_status(state, now=20.0, busy=0.5, nodes=("n1", "n2"))
    assert status.spec.name == "g"
    assert status.holder == "e"
    assert status.holder_since == 11.0
    assert set(status.queue) == {"c", "d"}
    assert list(status.resident) == ["b", "e"]
    assert list(status.parked) == ["a"]
    assert status.epoch == 7
    assert status.switches == 4
    assert status.last_switch_seconds == 0.25
    # A prefetch is not a switch: the group is held, and degraded with faulted jobs.
    assert status.phase == "Degraded"
    by_job = {j.job: j for j in status.jobs}
    assert set(by_job) == set(state.jobs)
    assert by_job["d"].state == pb.JOB_STATE_FAULTED
    assert by_job["d"].reason == "restore failed"
    assert by_job["a"].state == pb.JOB_STATE_PARKED
    assert by_job["e"].state == pb.JOB_STATE_HOLDING
    for name, record in state.jobs.items():
        shown = by_job[name]
        for field, wire in _proto.JOB_WIRE_CARRIES.items():
            want = getattr(record, field)
            if field == "held_seconds" and name == state.holder:
                want += 20.0 - state.holder_since
            if wire == "discarded_parts":  # both lists, those told first
                want = (*record.told_discarded, *record.discarded)
            assert getattr(shown, wire) == pytest.approx(want), (name, field)
