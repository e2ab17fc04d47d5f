"""Wire conversions: kernel config models to and from their protobuf messages.

`rlslice.config` stays pure pydantic; the scheduler's servicer, the operator's scheduler
client, the testing kit and the benches convert here, at the edge.
"""

from __future__ import annotations

from typing import Any

from rlslice.config import GroupSpec, JobSpec, MoveClass, PhaseKind, Policy, StatePart
from rlslice.v1alpha1 import scheduler_pb2

_POLICY_TO_PROTO = {
    Policy.FIFO: scheduler_pb2.POLICY_FIFO,
    Policy.PRIORITY: scheduler_pb2.POLICY_PRIORITY,
    Policy.FAIR: scheduler_pb2.POLICY_FAIR,
    Policy.LRS: scheduler_pb2.POLICY_LRS,
    Policy.STAGE: scheduler_pb2.POLICY_STAGE,
}
_POLICY_FROM_PROTO = {v: k for k, v in _POLICY_TO_PROTO.items()}
_KIND_TO_PROTO = {
    PhaseKind.ROLLOUT: scheduler_pb2.PHASE_KIND_ROLLOUT,
    PhaseKind.TRAIN: scheduler_pb2.PHASE_KIND_TRAIN,
    PhaseKind.SYNC: scheduler_pb2.PHASE_KIND_SYNC,
}
_KIND_FROM_PROTO = {v: k.value for k, v in _KIND_TO_PROTO.items()}


def group_spec_to_proto(spec: GroupSpec) -> scheduler_pb2.GroupSpec:
    """The wire form of a group spec."""
    return scheduler_pb2.GroupSpec(
        name=spec.name,
        policy=_POLICY_TO_PROTO[spec.policy],
        lease_seconds=spec.lease_seconds,
        max_hold_seconds=spec.max_hold_seconds,
        yield_grace_seconds=spec.yield_grace_seconds,
        backend=spec.backend,
        backend_options=dict(spec.backend_options),
        nodes=list(spec.nodes),
        headroom_bytes=spec.headroom_bytes,
        jobs=[
            scheduler_pb2.JobSpec(
                name=j.name,
                priority=j.priority,
                weight=j.weight,
                backend=j.backend,
                parts=[
                    scheduler_pb2.StatePart(
                        tag=p.tag,
                        bytes=p.bytes,
                        move_class=p.move_class.value,
                        need_order=p.need_order,
                    )
                    for p in j.parts
                ],
            )
            for j in spec.jobs
        ],
        node_selector=dict(spec.node_selector),
        require_agent_registration=spec.require_agent_registration,
        phases={
            name: scheduler_pb2.PhaseSpec(
                kind=_KIND_TO_PROTO[phase.kind], expected_seconds=phase.expected_seconds
            )
            for name, phase in spec.phases.items()
        },
        stage_aging_seconds=spec.stage_aging_seconds,
        early_yield=spec.early_yield,
    )


def group_spec_from_proto(message: scheduler_pb2.GroupSpec) -> GroupSpec:
    """Validate a wire spec; zero values take the defaults. Raises pydantic's ValidationError."""
    defaults = GroupSpec.model_fields
    return GroupSpec(
        name=message.name,
        policy=_POLICY_FROM_PROTO.get(message.policy, Policy.FIFO),
        lease_seconds=message.lease_seconds or defaults["lease_seconds"].default,
        max_hold_seconds=message.max_hold_seconds,
        yield_grace_seconds=message.yield_grace_seconds or defaults["yield_grace_seconds"].default,
        backend=message.backend or "sim",
        backend_options=dict(message.backend_options),
        nodes=tuple(message.nodes),
        headroom_bytes=message.headroom_bytes,
        jobs=tuple(
            JobSpec(
                name=j.name,
                priority=j.priority,
                weight=j.weight or 1.0,
                backend=j.backend,
                parts=tuple(
                    StatePart.model_validate(
                        {
                            "tag": p.tag,
                            "bytes": p.bytes,
                            "move_class": p.move_class or MoveClass.OFFLOAD.value,
                            "need_order": p.need_order,
                        }
                    )
                    for p in j.parts
                ),
            )
            for j in message.jobs
        ),
        node_selector=dict(message.node_selector),
        require_agent_registration=message.require_agent_registration,
        phases={name: _phase_from_proto(p) for name, p in message.phases.items()},
        stage_aging_seconds=message.stage_aging_seconds or defaults["stage_aging_seconds"].default,
        early_yield=message.early_yield if message.HasField("early_yield") else True,
    )


def _phase_from_proto(message: scheduler_pb2.PhaseSpec) -> Any:
    """A wire phase as model input: an unset kind stays "" so validation names the field."""
    return {
        "kind": _KIND_FROM_PROTO.get(message.kind, ""),
        "expected_seconds": message.expected_seconds,
    }
