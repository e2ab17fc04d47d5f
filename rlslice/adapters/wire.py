"""Wire conversions: kernel config models to and from their protobuf messages.

`rlslice.config` stays pure pydantic; the scheduler's servicer, the operator's scheduler
client, the testing kit and the benches convert here, at the edge.
"""

from __future__ import annotations

from rlslice.config import GroupSpec, JobSpec, Policy
from rlslice.v1alpha1 import scheduler_pb2

_POLICY_TO_PROTO = {
    Policy.FIFO: scheduler_pb2.POLICY_FIFO,
    Policy.PRIORITY: scheduler_pb2.POLICY_PRIORITY,
    Policy.FAIR: scheduler_pb2.POLICY_FAIR,
}
_POLICY_FROM_PROTO = {v: k for k, v in _POLICY_TO_PROTO.items()}


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
                name=j.name, priority=j.priority, weight=j.weight, backend=j.backend
            )
            for j in spec.jobs
        ],
        node_selector=dict(spec.node_selector),
        require_agent_registration=spec.require_agent_registration,
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
            JobSpec(name=j.name, priority=j.priority, weight=j.weight or 1.0, backend=j.backend)
            for j in message.jobs
        ),
        node_selector=dict(message.node_selector),
        require_agent_registration=message.require_agent_registration,
    )
