"""Core values -> protocol messages (the adapter's outbound half)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rlslice.adapters.wire import group_spec_to_proto
from rlslice.scheduler._runtime import EventEntry
from rlslice.scheduler.core import GroupState, Location, YieldReason, actions, order
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
    if state.switch is not None and state.switch.purpose == "grant":
        return "Switching"
    if state.faulted:
        return "Degraded"
    return "Held" if state.holder else "Idle"


def group_status(
    state: GroupState,
    *,
    now: float,
    busy: float,
    nodes: Sequence[str],
    lock_only: Collection[str] = (),
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
                lock_only=name in lock_only,
                phase=record.phase,
                last_served_at=record.last_served_at or 0.0,
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
