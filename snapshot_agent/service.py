"""The Agent gRPC service (TCP, for the scheduler): a thin translation over the engine."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from rlslice.adapters.auth import Role
from rlslice.adapters.grpc_errors import answer
from rlslice.adapters.server import method_roles
from rlslice.snapshot_agent import tier_moves
from rlslice.snapshot_agent.engine import AgentEngine, MoveReply, SwitchHalf, SwitchReply
from rlslice.snapshot_agent.state import JobState, Move
from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 300.0
"""Seconds a move may take when the caller set no deadline."""

STATE_TO_PROTO: dict[JobState, int] = {
    JobState.RUNNING: agent_pb2.AGENT_JOB_STATE_RUNNING,
    JobState.SAVING: agent_pb2.AGENT_JOB_STATE_SAVING,
    JobState.PARKED: agent_pb2.AGENT_JOB_STATE_PARKED,
    JobState.RESTORING: agent_pb2.AGENT_JOB_STATE_RESTORING,
    JobState.FAULTED: agent_pb2.AGENT_JOB_STATE_FAULTED,
}

#: Every Agent method needs the agent role (the admin token satisfies it too); the table is
#: derived from the proto, so a new RPC is covered the day it is added.
_AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["Agent"]
METHOD_ROLES: dict[str, Role] = method_roles(
    _AGENT_SERVICE, {method.name: Role.AGENT for method in _AGENT_SERVICE.methods}
)

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]


async def _answer(context: Context, work: Callable[[], Awaitable[T]]) -> T:
    return await answer(context, work, log=log)


def _timeout(context: Context) -> float:
    remaining: float | None = context.time_remaining()  # None: the caller set no deadline
    if remaining is None:
        return DEFAULT_TIMEOUT
    return max(0.0, remaining - 0.05)  # leave time to send the answer


def tier_moves_pb(moves: list[tier_moves.TierMove]) -> list[agent_pb2.TierMove]:
    """The wire form of the disk tier's moves."""
    return [
        agent_pb2.TierMove(job=m.job, direction=m.direction, bytes=m.nbytes, seconds=m.seconds)
        for m in moves
    ]


def move_result(
    reply: MoveReply, moved: list[tier_moves.TierMove] | None = None
) -> agent_pb2.MoveResult:
    """The wire form of a move's answer (with the tier moves it made, if any)."""
    return agent_pb2.MoveResult(
        tier_moves=tier_moves_pb(moved or []),
        job=reply.job,
        state=STATE_TO_PROTO.get(reply.state, 0) if reply.state else 0,  # type: ignore[arg-type]
        bytes=reply.bytes,
        seconds=reply.seconds,
        repeated=reply.repeated,
        absent=reply.absent,
        epoch=reply.epoch,
        backend=reply.backend,
    )


def _half(move: agent_pb2.SwitchMove) -> SwitchHalf:
    return SwitchHalf(move.job, move.backend, dict(move.options), tuple(move.discard_tags))


def switch_result(
    reply: SwitchReply, moved: list[tier_moves.TierMove] | None = None
) -> agent_pb2.SwitchResult:
    """The wire form of a Switch's answer; the tier moves go on the incoming job's result
    (on the first outgoing one without an incoming job), once."""
    on_incoming = reply.incoming is not None
    result = agent_pb2.SwitchResult(
        outgoing=[
            move_result(r, None if on_incoming or i else moved)
            for i, r in enumerate(reply.outgoing)
        ],
        seconds=reply.seconds,
        overlapped=reply.overlapped,
    )
    if reply.incoming is not None:
        result.incoming.CopyFrom(move_result(reply.incoming, moved))
    if reply.failure is not None:
        failure = reply.failure
        result.failure.CopyFrom(
            agent_pb2.SwitchFailure(
                job=failure.job,
                move=failure.move.value,
                reason=failure.reason,
                resource_exhausted=failure.resource_exhausted,
            )
        )
    return result


class AgentServicer(agent_pb2_grpc.AgentServicer):
    """Snapshot, Restore, Switch, Prefetch, Release, Status, Probe."""

    def __init__(self, engine: AgentEngine) -> None:
        self._engine = engine

    async def Snapshot(
        self, request: agent_pb2.SnapshotRequest, context: Context
    ) -> agent_pb2.MoveResult:
        return await self._move(Move.SNAPSHOT, request, context)

    async def Restore(
        self, request: agent_pb2.RestoreRequest, context: Context
    ) -> agent_pb2.MoveResult:
        return await self._move(Move.RESTORE, request, context)

    async def _move(
        self,
        move: Move,
        request: agent_pb2.SnapshotRequest | agent_pb2.RestoreRequest,
        context: Context,
    ) -> agent_pb2.MoveResult:
        """Snapshot and Restore: one move (a Restore names no discard tags)."""
        tags = tuple(request.discard_tags) if isinstance(request, agent_pb2.SnapshotRequest) else ()

        async def work() -> agent_pb2.MoveResult:
            with tier_moves.recording() as moved:
                reply = await self._engine.move(
                    move,
                    request.job,
                    request.group,
                    request.epoch,
                    backend=request.backend,
                    options=dict(request.options),
                    discard_tags=tags,
                    timeout=_timeout(context),
                )
            return move_result(reply, moved)

        return await _answer(context, work)

    async def Switch(
        self, request: agent_pb2.SwitchRequest, context: Context
    ) -> agent_pb2.SwitchResult:
        async def work() -> agent_pb2.SwitchResult:
            incoming = request.incoming if request.HasField("incoming") else None
            with tier_moves.recording() as moved:
                reply = await self._engine.switch(
                    request.group,
                    request.epoch,
                    [_half(m) for m in request.outgoing],
                    _half(incoming) if incoming is not None and incoming.job else None,
                    headroom_bytes=max(0, request.headroom_bytes),
                    timeout=_timeout(context),
                )
            return switch_result(reply, moved)

        return await _answer(context, work)

    async def Prefetch(
        self, request: agent_pb2.PrefetchRequest, context: Context
    ) -> agent_pb2.PrefetchResult:
        async def work() -> agent_pb2.PrefetchResult:
            with tier_moves.recording() as moved:
                filled = await self._engine.prefetch(request.job, request.group)
            return agent_pb2.PrefetchResult(
                job=request.job, filled_bytes=filled, tier_moves=tier_moves_pb(moved)
            )

        return await _answer(context, work)

    async def Release(
        self, request: agent_pb2.ReleaseRequest, context: Context
    ) -> agent_pb2.ReleaseResponse:
        async def work() -> agent_pb2.ReleaseResponse:
            freed, released = await self._engine.release(
                request.job, request.group, force=request.force
            )
            return agent_pb2.ReleaseResponse(freed_bytes=freed, released=released)

        return await _answer(context, work)

    async def Status(
        self, request: agent_pb2.AgentStatusRequest, context: Context
    ) -> agent_pb2.AgentStatus:
        async def work() -> agent_pb2.AgentStatus:
            view = await self._engine.status()
            return agent_pb2.AgentStatus(
                node=view.node,
                jobs=[
                    agent_pb2.AgentJob(
                        job=j.record.job,
                        group=j.record.group,
                        state=STATE_TO_PROTO[j.record.state],  # type: ignore[arg-type]
                        reason=j.record.reason,
                        pids=list(j.pids),
                        device_bytes=j.device_bytes,
                        host_bytes=j.host_bytes,
                        backend=j.backend,
                        epoch=j.record.epoch,
                    )
                    for j in view.jobs
                ],
                devices=[
                    agent_pb2.Device(
                        index=d.index,
                        used_bytes=d.used_bytes,
                        total_bytes=d.total_bytes,
                        name=d.name,
                    )
                    for d in view.devices
                ],
                host_available_bytes=view.host_available,
                backends=list(view.backends),
                default_backend=view.default_backend,
            )

        return await _answer(context, work)

    async def Probe(
        self, request: agent_pb2.ProbeRequest, context: Context
    ) -> agent_pb2.ProbeResponse:
        async def work() -> agent_pb2.ProbeResponse:
            results = await self._engine.probe()
            return agent_pb2.ProbeResponse(
                backends=[
                    agent_pb2.BackendProbe(name=name, usable=p.usable, detail=p.detail)
                    for name, p in results
                ]
            )

        return await _answer(context, work)
