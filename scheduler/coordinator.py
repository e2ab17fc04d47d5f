"""The coordinator: executes a group's switch over the node agents.

1. `Status` from every node of the group, in parallel: device memory and where each job is.
2. Decide evictions (`core.residency.choose_evictions`): the preempted holder always, then
   resident jobs least recently used first, only while the incoming job does not fit.
3. `Snapshot` the evicted jobs on every node where they run, in parallel. If any fails,
   roll back: `Restore` (with the switch's rollback epoch) wherever a snapshot succeeded,
   so the outgoing job keeps running, and report SnapshotFailed.
4. `Restore` the incoming job on every node where it is parked, in parallel. A failure is
   reported as RestoreFailed (the core retries once, then marks the job FAULTED).
5. Report SwitchDone; the engine grants.

Every call has a deadline; UNAVAILABLE is retried with exponential backoff. A group with no
agents never reaches here: its switch is a pure lock handoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from rlslice._errors import (
    AbortedError,
    FailedPreconditionError,
    ResourceExhaustedError,
    RlsliceError,
)
from rlslice.adapters.channel import open_channel
from rlslice.adapters.tracing import SWITCH, span
from rlslice.config import GroupSpec, TLSConfig
from rlslice.scheduler.core import GroupState, NodeMemory, Switch, choose_evictions, events
from rlslice.scheduler.core.membership import group_nodes
from rlslice.scheduler.store import AgentRecord
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

log = logging.getLogger(__name__)

#: Backend option of a snapshot that fences a job whose lease lapsed while it held: it may
#: be mid-step, so the backend stops its processes before anything moves (`app`: frozen,
#: no offload under a running step).
FENCE_OPTION = "fence"
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE}
_TRANSPORT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_PARKED = {apb.AGENT_JOB_STATE_PARKED, apb.AGENT_JOB_STATE_FAULTED, apb.AGENT_JOB_STATE_RESTORING}


class AgentCallError(Exception):
    """One agent call failed for good."""

    def __init__(self, node: str, what: str, code: grpc.StatusCode | None, detail: str) -> None:
        self.node, self.code = node, code
        name = code.name if code else "UNAVAILABLE"
        super().__init__(f"node {node}: {what}: {name}: {detail}")

    @property
    def kind(self) -> type[RlsliceError]:
        """The error kind a waiter should see."""
        if self.code in _TRANSPORT or self.code is None:
            # ABORTED, not UNAVAILABLE: clients retry UNAVAILABLE as a scheduler outage, and
            # would freeze and roll back the outgoing job again and again.
            return AbortedError
        if self.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return ResourceExhaustedError  # host memory short: the outgoing job runs on
        return FailedPreconditionError


@dataclass(frozen=True, slots=True)
class _Channel:
    address: str
    channel: grpc.aio.Channel
    stub: Any


class Coordinator:
    """Knows the agents and runs switches and releases over them."""

    def __init__(
        self,
        *,
        token: str | None = None,
        tls: TLSConfig | None = None,
        rpc_timeout: float = 60.0,
        status_timeout: float = 5.0,
        retries: int = 3,
        backoff: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.agents: dict[str, AgentRecord] = {}
        self._token, self._tls = token, tls
        self._rpc_timeout, self._status_timeout = rpc_timeout, status_timeout
        self._retries, self._backoff = retries, backoff
        self._clock = clock
        self._channels: dict[str, _Channel] = {}
        self._closing: set[asyncio.Task[None]] = set()

    # -- agents -----------------------------------------------------------------------

    def add_agent(self, record: AgentRecord) -> None:
        """Remember an agent (a re-registration replaces the old record and channel)."""
        self.agents[record.node] = record
        old = self._channels.get(record.node)
        if old is not None and old.address != record.address:
            del self._channels[record.node]
            task = asyncio.ensure_future(old.channel.close(None))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def nodes_for(self, spec: GroupSpec) -> tuple[str, ...]:
        """The group's nodes: its spec's `nodes`, else the registered agents whose labels
        match its node selector (all of them without one); see `core.membership`."""
        return group_nodes(spec, {node: agent.labels for node, agent in self.agents.items()})

    async def close(self) -> None:
        """Close every channel."""
        channels = list(self._channels.values())
        self._channels.clear()
        await asyncio.gather(*(c.channel.close(None) for c in channels), *self._closing)

    def _stub(self, node: str) -> Any:
        record = self.agents.get(node)
        if record is None:
            raise AgentCallError(node, "no agent registered", None, "node unknown")
        cached = self._channels.get(node)
        if cached is None:
            channel = open_channel(record.address, tls=self._tls, token=self._token)
            cached = _Channel(record.address, channel, agent_pb2_grpc.AgentStub(channel))
            self._channels[node] = cached
        return cached.stub

    async def _call(self, node: str, method: str, request: Any, timeout: float, what: str) -> Any:
        """One agent call with a deadline; UNAVAILABLE is retried with exponential backoff."""
        for attempt in range(self._retries + 1):
            try:
                return await getattr(self._stub(node), method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as error:
                if error.code() in _RETRYABLE and attempt < self._retries:
                    await asyncio.sleep(self._backoff * 2**attempt)
                    continue
                raise AgentCallError(node, what, error.code(), error.details() or "") from None
        raise AssertionError("unreachable")  # pragma: no cover

    # -- switches ---------------------------------------------------------------------

    async def run_switch(self, state: GroupState, switch: Switch) -> events.Event:
        """Execute `switch` for `state`'s group; the result event for the core.

        Traced as an `rlslice.switch` span (a no-op without OpenTelemetry)."""
        async with span(
            SWITCH,
            group=state.name,
            epoch=switch.epoch,
            incoming=switch.incoming,
            nodes=self.nodes_for(state.spec),
        ) as traced:
            result = await self._switch(state, switch)
            traced.set(**_traced_outcome(result))
            return result

    async def _switch(self, state: GroupState, switch: Switch) -> events.Event:
        started = self._clock()
        spec = state.spec
        nodes = self.nodes_for(spec)
        statuses = await self._statuses(nodes)
        evict = self._evictions(state, switch, nodes, statuses)
        # A switch resumed after a restart finds some jobs parked already: evicted all the same.
        evict += tuple(
            job
            for job in (*switch.evict, *switch.candidates)
            if job not in evict and _parked_somewhere(statuses.values(), job, state.name)
        )
        moved = 0

        snapshots = [
            (job, node)
            for job in evict
            for node in nodes
            if _needs(statuses.get(node), job, state.name, snapshot=True)
        ]
        results = await self._moves("Snapshot", spec, snapshots, switch.epoch, switch.fence)
        failures = [r for r in results if isinstance(r, AgentCallError)]
        if failures:
            # A fenced job (its lease lapsed while it held) stays fenced where it is: rolling
            # it back would let a holder nobody can reach run beside the next one.
            done = [
                (job, node)
                for (job, node), r in zip(snapshots, results, strict=True)
                if isinstance(r, apb.MoveResult) and not r.absent and job not in switch.fence
            ]
            await self._rollback(spec, done, switch.rollback_epoch)
            reason = "; ".join(str(f) for f in failures)
            if done:
                reason += f" (rolled back on {len(done)} node(s))"
            return events.SnapshotFailed(switch.epoch, reason, failures[0].kind)
        moved += sum(r.bytes for r in results if isinstance(r, apb.MoveResult))

        restores = [
            (switch.incoming, node)
            for node in nodes
            if _needs(statuses.get(node), switch.incoming, state.name, snapshot=False)
            or (statuses.get(node) is None and switch.restore)
        ]
        results = await self._moves("Restore", spec, restores, switch.epoch)
        failures = [r for r in results if isinstance(r, AgentCallError)]
        moved += sum(r.bytes for r in results if isinstance(r, apb.MoveResult))
        if failures:
            reason = "; ".join(str(f) for f in failures)
            return events.RestoreFailed(switch.epoch, reason, evict, moved)
        return events.SwitchDone(switch.epoch, evict, moved, self._clock() - started)

    async def agent_jobs(self, spec: GroupSpec) -> dict[str, list[tuple[str, str]]]:
        """The (job, group) pairs each node of the group knows; nodes that did not answer
        are left out (see `rlslice.scheduler.registration`)."""
        statuses = await self._statuses(self.nodes_for(spec))
        return {node: [(j.job, j.group) for j in s.jobs] for node, s in statuses.items()}

    async def parking_capacity(self, spec: GroupSpec) -> dict[str, int]:
        """Host bytes each node of the group can give the group's parked state: what its
        agent reports available now, plus what the group parks there already. A node that
        does not answer Status counts with what it reported at registration; a node that
        never reported host memory (0, the wire's "unset") is left out (unknown)."""
        nodes = self.nodes_for(spec)
        statuses = await self._statuses(nodes)
        capacity: dict[str, int] = {}
        for node in nodes:
            status = statuses.get(node)
            if status is not None and status.host_available_bytes > 0:
                mine = sum(j.host_bytes for j in status.jobs if j.group == spec.name)
                capacity[node] = status.host_available_bytes + mine
            elif (record := self.agents.get(node)) is not None and record.host_available_bytes:
                capacity[node] = record.host_available_bytes
        return capacity

    async def _statuses(self, nodes: tuple[str, ...]) -> dict[str, apb.AgentStatus]:
        async def one(node: str) -> apb.AgentStatus | None:
            try:
                status: apb.AgentStatus = await self._call(
                    node, "Status", apb.AgentStatusRequest(), self._status_timeout, "status"
                )
                return status
            except AgentCallError as error:
                log.warning("%s", error)
                return None

        found = await asyncio.gather(*(one(node) for node in nodes))
        return {node: s for node, s in zip(nodes, found, strict=True) if s is not None}

    def _evictions(
        self,
        state: GroupState,
        switch: Switch,
        nodes: tuple[str, ...],
        statuses: Mapping[str, apb.AgentStatus],
    ) -> tuple[str, ...]:
        """Which jobs leave the GPUs. Unknown sizes or silent nodes: evict every candidate."""
        everyone = (*switch.evict, *(j for j in switch.candidates if j not in switch.evict))
        record = state.jobs.get(switch.incoming)
        need: dict[str, int] = {}
        memory = []
        for node in nodes:
            status = statuses.get(node)
            if status is None:
                return everyone
            jobs = {j.job: j for j in status.jobs if j.group == state.name}
            mine = jobs.get(switch.incoming)
            if mine is not None and mine.state == apb.AGENT_JOB_STATE_RUNNING:
                # On the device already (a switch resumed after its restore finished, or a
                # job that allocated before it first acquired): what it holds there counts
                # in `used`; only the rest of what it declared is still needed.
                declared = record.device_bytes if record is not None else 0
                need[node] = max(0, declared - mine.device_bytes)
            elif mine is not None and mine.state in _PARKED:
                need[node] = mine.host_bytes
            elif record is not None and record.device_bytes:
                need[node] = record.device_bytes
            elif mine is None or mine.state != apb.AGENT_JOB_STATE_RUNNING:
                return everyone  # how much the incoming job needs is unknown
            # A job's bytes are taken as spread evenly over the node's devices, so it fits
            # only where the fullest device has room for its share: summing free memory
            # over devices would restore a job beside another that fills its device.
            frees = [d.total_bytes - d.used_bytes for d in status.devices]
            free = len(frees) * min(frees) if frees else 0
            memory.append(NodeMemory(node, free, {j: a.device_bytes for j, a in jobs.items()}))
        return choose_evictions(
            need,
            memory,
            switch.candidates,
            must_evict=switch.evict,
            headroom_bytes=state.spec.headroom_bytes,
        )

    async def _moves(
        self,
        method: str,
        spec: GroupSpec,
        pairs: list[tuple[str, str]],
        epoch: int,
        fence: tuple[str, ...] = (),
    ) -> list[apb.MoveResult | AgentCallError]:
        async def one(job: str, node: str) -> apb.MoveResult | AgentCallError:
            backend = spec.job(job).backend or spec.backend
            options = dict(spec.backend_options)
            if job in fence:
                options[FENCE_OPTION] = "1"  # the backend stops the job before moving anything
            request: Any
            if method == "Snapshot":
                request = apb.SnapshotRequest(
                    job=job, group=spec.name, epoch=epoch, backend=backend, options=options
                )
            else:
                request = apb.RestoreRequest(
                    job=job, group=spec.name, epoch=epoch, backend=backend, options=options
                )
            what = f"{method.lower()} of job {job}"
            try:
                result: apb.MoveResult = await self._call(
                    node, method, request, self._rpc_timeout, what
                )
                return result
            except AgentCallError as error:
                return error

        return list(await asyncio.gather(*(one(job, node) for job, node in pairs)))

    async def _rollback(self, spec: GroupSpec, done: list[tuple[str, str]], epoch: int) -> None:
        """Undo snapshots that succeeded, so the outgoing job runs on everywhere."""
        results = await self._moves("Restore", spec, done, epoch)
        for (job, node), result in zip(done, results, strict=True):
            if isinstance(result, AgentCallError):
                # The job stays parked there; its next acquire restores it.
                log.error("rollback of job %s on node %s failed: %s", job, node, result)

    async def release(self, spec: GroupSpec, job: str, force: bool) -> None:
        """Ask every node of the group to drop `job`'s state (see Agent.Release)."""
        request = apb.ReleaseRequest(job=job, group=spec.name, force=force)

        async def one(node: str) -> None:
            try:
                await self._call(
                    node, "Release", request, self._status_timeout, f"release of {job}"
                )
            except AgentCallError as error:
                # NOT_FOUND: that node never knew the job (a lock-only job, or one whose
                # processes run elsewhere): nothing was there to release.
                quiet = error.code == grpc.StatusCode.NOT_FOUND
                log.log(logging.DEBUG if quiet else logging.WARNING, "%s", error)

        await asyncio.gather(*(one(node) for node in self.nodes_for(spec)))


def _traced_outcome(result: events.Event) -> dict[str, Any]:
    """Span attributes at the end of a switch: outcome, and what moved."""
    if isinstance(result, events.SwitchDone):
        return {
            "outcome": "done",
            "outgoing": result.evicted,
            "bytes": result.moved_bytes,
            "seconds": result.seconds,
        }
    if isinstance(result, events.RestoreFailed):
        return {
            "outcome": "restore_failed",
            "outgoing": result.evicted,
            "bytes": result.moved_bytes,
        }
    return {"outcome": "snapshot_failed"}


def _needs(status: apb.AgentStatus | None, job: str, group: str, *, snapshot: bool) -> bool:
    """Whether `job` needs a snapshot (or restore) on the node `status` describes. A node
    that did not answer Status gets the call anyway for snapshots (it fails or is a no-op)."""
    if status is None:
        return snapshot
    for entry in status.jobs:
        if entry.job == job and entry.group == group:
            if snapshot:
                return entry.state != apb.AGENT_JOB_STATE_PARKED
            return entry.state in _PARKED
    return False


def _parked_somewhere(statuses: Iterable[apb.AgentStatus], job: str, group: str) -> bool:
    return any(
        entry.job == job and entry.group == group and entry.state == apb.AGENT_JOB_STATE_PARKED
        for status in statuses
        for entry in status.jobs
    )
