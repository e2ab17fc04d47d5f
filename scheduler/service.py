"""The gRPC servicer: validates requests, calls the engine, translates results and errors.

Every refusal is an `rlslice` error raised before any state changes; `abort_with` turns it
into the status code and one-line message. Token roles are checked earlier, by the
`TokenAuthInterceptor` with `METHOD_ROLES`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from rlslice._errors import FailedPreconditionError, RlsliceError, UnavailableError
from rlslice._ids import validate_id
from rlslice.adapters.auth import Role
from rlslice.adapters.grpc_errors import abort_with, answer
from rlslice.adapters.server import method_roles
from rlslice.scheduler import _proto, _validate
from rlslice.scheduler._runtime import EventEntry, GroupRuntime
from rlslice.scheduler.coordinator import Coordinator
from rlslice.scheduler.core import GroupState, YieldReason, yield_reason
from rlslice.scheduler.core.spec_change import jobs_off_device, node_change_refusal
from rlslice.scheduler.engine import Engine
from rlslice.scheduler.store import AgentRecord
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

#: The token role each method needs, checked against the proto at import: a new RPC
#: cannot ship without a role (the interceptor refuses methods it has no role for).
METHOD_ROLES: dict[str, Role] = method_roles(
    pb.DESCRIPTOR.services_by_name["Scheduler"],
    {
        "Register": Role.JOB,
        "KeepAlive": Role.JOB,
        "Unregister": Role.JOB,
        "Acquire": Role.JOB,
        "Yield": Role.JOB,
        "GetGroup": Role.JOB,
        "ListGroups": Role.JOB,
        "Watch": Role.JOB,
        "GetEvents": Role.JOB,
        "PutGroup": Role.ADMIN,
        "DeleteGroup": Role.ADMIN,
        "RegisterAgent": Role.AGENT,
        "UnregisterAgent": Role.AGENT,
        "RemoveAgent": Role.ADMIN,
    },
)

log = logging.getLogger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R")


def _refusals(
    method: Callable[[SchedulerService, Any, Context], Awaitable[R]],
) -> Callable[[SchedulerService, Any, Context], Awaitable[R]]:
    """Turn rlslice errors into gRPC statuses."""

    @functools.wraps(method)
    async def wrapper(self: SchedulerService, request: Any, context: Context) -> R:
        async def work() -> R:
            self._check_ready()
            return await method(self, request, context)

        return await answer(context, work, log=log)

    return wrapper


class SchedulerService(scheduler_pb2_grpc.SchedulerServicer):
    """rlslice.v1alpha1.Scheduler over an `Engine`."""

    def __init__(self, engine: Engine, coordinator: Coordinator) -> None:
        self.engine = engine
        self.coordinator = coordinator

    # -- helpers ----------------------------------------------------------------------

    def _check_ready(self) -> None:
        # The port opens before the store is loaded (health answers NOT_SERVING meanwhile):
        # a call answered from the empty state would lose leases, or create groups twice.
        if not self.engine.ready:
            raise UnavailableError("scheduler: starting (state not loaded yet); retry")

    def status(self, state: GroupState, runtime: GroupRuntime | None = None) -> pb.GroupStatus:
        now = self.engine.clock()
        busy = 0.0
        if runtime is not None:
            busy = runtime.busy.fraction(now, state.holder_since if state.holder else None)
        nodes = self.coordinator.nodes_for(state.spec)
        return _proto.group_status(state, now=now, busy=busy, nodes=nodes)

    def event(self, entry: EventEntry) -> pb.GroupEvent:
        return _proto.group_event(
            entry, self.status(entry.state, self.engine.groups.get(entry.group))
        )

    # -- jobs -------------------------------------------------------------------------

    @_refusals
    async def Register(self, request: pb.RegisterRequest, context: Context) -> pb.RegisterResponse:
        _validate.register(request)
        done = await self.engine.register_job(
            request.group,
            request.job,
            request.lease_seconds,
            request.priority if request.HasField("priority") else None,
            request.weight if request.HasField("weight") else None,
            request.device_bytes,
            request.session,
        )
        return pb.RegisterResponse(
            lease_id=done.lease_id,
            secret=done.secret,
            lease_seconds=done.lease_seconds,
            epoch=done.epoch,
            warning=done.warning,
        )

    @_refusals
    async def KeepAlive(
        self, request: pb.KeepAliveRequest, context: Context
    ) -> pb.KeepAliveResponse:
        _validate.lease(request.lease_id, request.secret)
        ttl, asked, left = self.engine.keepalive(request.lease_id, request.secret)
        reason = YieldReason.NONE
        if asked:
            runtime, record = self.engine.lease(request.lease_id, request.secret)
            reason = yield_reason(runtime.state, record.name, self.engine.clock())
        return _proto.keepalive_response(ttl, asked, left, reason)

    @_refusals
    async def Unregister(
        self, request: pb.UnregisterRequest, context: Context
    ) -> pb.UnregisterResponse:
        _validate.lease(request.lease_id, request.secret)
        self.engine.unregister(request.lease_id, request.secret)
        return pb.UnregisterResponse()

    @_refusals
    async def Acquire(self, request: pb.AcquireRequest, context: Context) -> pb.Grant:
        validate_id(request.job, "job")
        validate_id(request.group, "group")
        _validate.lease(request.lease_id, request.secret)
        _validate.phase(request.phase)
        grant = await self.engine.acquire(
            request.group, request.job, request.lease_id, request.secret, request.phase
        )
        engine, group, job, epoch = self.engine, request.group, request.job, grant.epoch

        def gone(call: Any) -> None:
            # The grant was decided but the caller left before reading it.
            if call.cancelled():
                engine.lost_grant(group, job, epoch)

        context.add_done_callback(gone)  # type: ignore[arg-type]
        return pb.Grant(
            epoch=grant.epoch,
            waited_seconds=grant.waited_seconds,
            restored=grant.restored,
            switch_seconds=grant.switch_seconds,
            moved_bytes=grant.moved_bytes,
            group=request.group,
            job=request.job,
            discarded=grant.discarded,
        )

    @_refusals
    async def Yield(self, request: pb.YieldRequest, context: Context) -> pb.YieldResponse:
        validate_id(request.job, "job")
        validate_id(request.group, "group")
        _validate.lease(request.lease_id, request.secret)
        answer = self.engine.yield_(request.group, request.job, request.lease_id, request.secret)
        return pb.YieldResponse(waiters=answer.waiters, snapshot_deferred=answer.snapshot_deferred)

    # -- reading ----------------------------------------------------------------------

    @_refusals
    async def GetGroup(self, request: pb.GetGroupRequest, context: Context) -> pb.GroupStatus:
        validate_id(request.group, "group")
        runtime = self.engine.group(request.group)
        return self.status(runtime.state, runtime)

    @_refusals
    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: Context
    ) -> pb.ListGroupsResponse:
        groups = sorted(self.engine.groups.items())
        return pb.ListGroupsResponse(groups=[self.status(r.state, r) for _, r in groups])

    @_refusals
    async def GetEvents(
        self, request: pb.GetEventsRequest, context: Context
    ) -> pb.GetEventsResponse:
        validate_id(request.group, "group")
        if request.limit < 0:
            from rlslice._errors import InvalidArgumentError

            raise InvalidArgumentError(f"limit: {request.limit} is negative")
        entries = list(self.engine.group(request.group).ring)
        if request.limit:
            entries = entries[-request.limit :]
        return pb.GetEventsResponse(events=[self.event(e) for e in entries])

    async def Watch(
        self, request: pb.WatchRequest, context: Context
    ) -> AsyncIterator[pb.GroupEvent]:
        try:
            self._check_ready()
            if request.group:
                validate_id(request.group, "group")
            queue = self.engine.watch(request.group)
        except RlsliceError as error:
            await abort_with(context, error)
            return
        try:
            names = [request.group] if request.group else sorted(self.engine.groups)
            for name in names:
                runtime = self.engine.groups.get(name)
                if runtime is not None:
                    yield self.event(self.engine.snapshot_entry(runtime))
            while True:
                entry = await queue.get()
                if entry is None:
                    return
                yield self.event(entry)
        finally:
            self.engine.unwatch(request.group, queue)

    # -- administration ---------------------------------------------------------------

    @_refusals
    async def PutGroup(self, request: pb.PutGroupRequest, context: Context) -> pb.GroupStatus:
        spec = _validate.group_spec(request)
        state = self.engine.put_group(spec)
        return self.status(state, self.engine.groups.get(spec.name))

    @_refusals
    async def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: Context
    ) -> pb.DeleteGroupResponse:
        validate_id(request.group, "group")
        self.engine.delete_group(request.group, request.force)
        return pb.DeleteGroupResponse()

    def _keep_nodes_with_state(self, before: dict[str, tuple[str, ...]]) -> None:
        """A group whose selector now resolves to other nodes (an agent's labels changed)
        keeps its old nodes while state is parked on them (see `core.spec_change`)."""
        for name, old in before.items():
            runtime = self.engine.groups.get(name)
            if runtime is None:
                continue
            refusal = node_change_refusal(
                runtime.state, old, self.coordinator.nodes_for(runtime.state.spec)
            )
            if refusal is None:
                continue
            log.warning("agent registration: %s", refusal)

            def holds(name: str = name, runtime: GroupRuntime = runtime) -> bool:
                return self.engine.groups.get(name) is runtime and bool(
                    jobs_off_device(runtime.state)
                )

            self.coordinator.keep_nodes(name, old, holds)

    @_refusals
    async def UnregisterAgent(
        self, request: pb.UnregisterAgentRequest, context: Context
    ) -> pb.UnregisterAgentResponse:
        return self._remove_agent(request.node, force=False)

    @_refusals
    async def RemoveAgent(
        self, request: pb.RemoveAgentRequest, context: Context
    ) -> pb.UnregisterAgentResponse:
        return self._remove_agent(request.node, force=request.force)

    def _remove_agent(self, node: str, *, force: bool) -> pb.UnregisterAgentResponse:
        validate_id(node, "node")
        if node not in self.coordinator.agents:
            return pb.UnregisterAgentResponse(removed=False)
        why = self.coordinator.state_on(node)
        if why is not None and not force:
            raise FailedPreconditionError(f"node {node}: {why} (force removes it anyway)")
        log.warning("agent on node %s removed%s", node, f" although {why}" if why else "")
        self.coordinator.remove_agent(node)
        return pb.UnregisterAgentResponse(removed=True)

    @_refusals
    async def RegisterAgent(
        self, request: pb.RegisterAgentRequest, context: Context
    ) -> pb.RegisterAgentResponse:
        _validate.agent(request)
        record = AgentRecord(
            node=request.node,
            address=request.address,
            backends=tuple(request.backends),
            device_total_bytes=tuple(request.device_total_bytes),
            host_available_bytes=request.host_available_bytes,
            labels=dict(request.labels),
            registered_at=self.engine.clock(),
        )
        before = {
            name: self.coordinator.nodes_for(runtime.state.spec)
            for name, runtime in self.engine.groups.items()
        }
        self.coordinator.add_agent(record)
        self._keep_nodes_with_state(before)
        self.engine.store.save_agent(record)
        self.engine.metrics.agents.set(len(self.coordinator.agents))
        groups = [
            runtime.state
            for _, runtime in sorted(self.engine.groups.items())
            if request.node in self.coordinator.nodes_for(runtime.state.spec)
        ]
        # What the agent may keep parked: a job not listed here whose processes are gone
        # was released while the agent could not hear it.
        jobs = [
            pb.GroupJob(group=state.name, job=job)
            for state in groups
            for job in sorted(state.known_jobs())
        ]
        return pb.RegisterAgentResponse(
            groups=[state.name for state in groups], jobs=jobs, jobs_listed=True
        )
