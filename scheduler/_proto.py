"""Core values -> protocol messages (the adapter's outbound half)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from rlslice.adapters.wire import group_spec_to_proto
from rlslice.scheduler._runtime import EventEntry
from rlslice.scheduler.core import (
    GroupState,
    JobRecord,
    Location,
    SwitchKind,
    YieldReason,
    actions,
    order,
)
from rlslice.v1alpha1 import scheduler_pb2 as pb

_JOB_STATE = {
    Location.IDLE: pb.JOB_STATE_IDLE,
    Location.RESIDENT: pb.JOB_STATE_RESIDENT,
    Location.HOLDING: pb.JOB_STATE_HOLDING,
    Location.PARKED: pb.JOB_STATE_PARKED,
    Location.FAULTED: pb.JOB_STATE_FAULTED,
}
_EVENT_KIND = {kind.value: getattr(pb, f"EVENT_KIND_{kind.name}") for kind in actions.Kind}
_EVENT_KIND["snapshot"] = pb.EVENT_KIND_SNAPSHOT
_YIELD_REASON = {
    YieldReason.NONE: pb.YIELD_REASON_UNSPECIFIED,
    YieldReason.MAX_HOLD: pb.YIELD_REASON_MAX_HOLD,
    YieldReason.PREEMPTED: pb.YIELD_REASON_PREEMPTED,
    YieldReason.TRAIN_WAITING: pb.YIELD_REASON_TRAIN_WAITING,
}

#: Each `GroupState` field the wire carries -> the `GroupStatus` fields that show it.
WIRE_CARRIES: Mapping[str, tuple[str, ...]] = {
    "spec": ("spec",),
    "jobs": ("jobs",),
    "holder": ("holder",),
    "holder_since": ("holder_since",),
    "queue": ("queue",),
    "placement": ("resident", "parked", "jobs.state", "jobs.reason"),
    "epoch": ("epoch",),
    "switch": ("phase",),
    "switches": ("switches",),
    "last_switch_seconds": ("last_switch_seconds",),
}
#: Each `GroupState` field the wire leaves out on purpose -> why.
WIRE_OMITS: Mapping[str, str] = {
    "yield_requested_at": "the lease timer's; a KeepAlive answer says to yield",
    "preempted": "bookkeeping of which late Yield to accept",
    "last_switch_at": "the metrics' and the timeline's (ring events carry times)",
    "prefetched": "a prefetched job shows as resident",
    "unfit": "remembers one skipped prefetch; the ring's PrefetchSkipped event says so",
    "fencing": "internal until fenced: no grant happens meanwhile (phase stays as is)",
    "acknowledged": "guards against a late LostGrant; nothing a reader acts on",
}
#: Each `JobRecord` field the wire carries -> its `JobStatus` field.
JOB_WIRE_CARRIES: Mapping[str, str] = {
    "name": "job",
    "expires_at": "lease_expires_at",
    "device_bytes": "device_bytes",
    "held_seconds": "held_seconds",
    "last_served_at": "last_served_at",
    "phase": "phase",
    "lock_only": "lock_only",
    "discarded": "discarded_parts",
    "told_discarded": "discarded_parts",
    "parked_parts": "parked_parts",
}
#: Each `JobRecord` field the wire leaves out on purpose -> why.
JOB_WIRE_OMITS: Mapping[str, str] = {
    "lease_id": "the lease's handle is the job's own; others must not renew it",
    "secret_hash": "never leaves the scheduler",
    "lease_seconds": "expires_at says when the lease lapses",
    "priority": "scheduling input from the spec or the job's Register",
    "weight": "scheduling input from the spec or the job's Register",
    "session": "the deadlock check's; identifies a client instance",
}


def _check_covered(kind: str, fields: Collection[str], *said: Collection[str]) -> None:
    covered = set().union(*said)
    if covered != set(fields):
        raise TypeError(  # pragma: no cover - a developer's mistake, caught by any import
            f"the wire form of {kind} and its fields disagree: "
            f"{sorted(covered.symmetric_difference(fields))}"
        )


_check_covered("GroupState", GroupState.__slots__, WIRE_CARRIES, WIRE_OMITS)
_check_covered("JobRecord", JobRecord.__slots__, JOB_WIRE_CARRIES, JOB_WIRE_OMITS)


def keepalive_response(
    ttl: float, asked: bool, preempt_in: float, reason: YieldReason
) -> pb.KeepAliveResponse:
    """The answer to a KeepAlive: the lease's ttl and whether (and why) to yield."""
    return pb.KeepAliveResponse(
        ttl_seconds=ttl,
        yield_requested=asked,
        preempt_in_seconds=preempt_in,
        yield_reason=_YIELD_REASON[reason],
    )


def phase(state: GroupState) -> str:
    """ "Idle", "Held", "Switching" or "Degraded" (some job is FAULTED). A prefetch beside
    the holder is not a switch: the group is held meanwhile."""
    if state.switch is not None and state.switch.purpose == SwitchKind.GRANT:
        return "Switching"
    if state.faulted:
        return "Degraded"
    return "Held" if state.holder else "Idle"


def discarded_parts(record: JobRecord) -> tuple[str, ...]:
    """`JobStatus.discarded_parts`: the tags of the job's discarded parts still to rebuild
    as far as the scheduler knows: while it holds, those its grant told (`told_discarded`,
    read back by a client that lost that answer), then those its next grant will tell."""
    return tuple(dict.fromkeys((*record.told_discarded, *record.discarded)))


def group_status(
    state: GroupState,
    *,
    now: float,
    busy: float,
    nodes: Sequence[str],
) -> pb.GroupStatus:
    """The wire form of a group's state."""
    spec = state.spec
    queue = order(
        spec.policy,
        state.queue,
        state.jobs,
        now,
        phases=spec.phases,
        stage_aging_seconds=spec.stage_aging_seconds,
    )
    position = {w.job: i + 1 for i, w in enumerate(queue)}
    jobs = []
    for name, record in state.jobs.items():
        held = record.held_seconds
        if state.holder == name:
            held += max(0.0, now - state.holder_since)
        jobs.append(
            pb.JobStatus(
                job=name,
                state=_JOB_STATE[state.location(name)],
                queue_position=position.get(name, 0),
                device_bytes=record.device_bytes,
                held_seconds=held,
                reason=state.faulted.get(name, ""),
                lease_expires_at=record.expires_at,
                lock_only=record.lock_only,
                phase=record.phase,
                last_served_at=record.last_served_at or 0.0,
                discarded_parts=discarded_parts(record),
                parked_parts=record.parked_parts,
            )
        )
    return pb.GroupStatus(
        spec=group_spec_to_proto(state.spec),
        holder=state.holder or "",
        queue=[w.job for w in queue],
        resident=list(state.resident),
        parked=list(state.parked),
        epoch=state.epoch,
        busy_fraction=busy,
        last_switch_seconds=state.last_switch_seconds,
        switches=state.switches,
        jobs=jobs,
        phase=phase(state),
        nodes=list(nodes),
        holder_since=state.holder_since if state.holder else 0.0,
    )


def group_event(entry: EventEntry, status: pb.GroupStatus) -> pb.GroupEvent:
    """The wire form of one ring entry."""
    return pb.GroupEvent(
        time=entry.time,
        group=entry.group,
        kind=_EVENT_KIND[entry.kind],
        job=entry.job,
        epoch=entry.state.epoch,
        seconds=entry.seconds,
        bytes=entry.bytes,
        detail=entry.detail,
        status=status,
        seq=entry.seq,
    )
