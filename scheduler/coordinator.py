"""The coordinator: executes a group's switch over the node agents.

1. `Status` from every node of the group, in parallel: device memory and where each job is.
   Not for the grant that follows a prefetch which found no room beside its waiter for
   any resident job (`core.moves.evicts_every_candidate`), nothing moved between: that
   switch evicts every resident job whatever the numbers, so it is planned as over silent
   nodes (docs/scheduler.md, "Switches").
2. Plan (`core.moves.plan_switch`, pure, over plain per-node reports): the jobs to evict
   (the preempted holder always, then resident jobs least recently used first, only while
   the incoming job does not fit) and, per node, the snapshots and the restore to run.
   A job that declared parts (`JobSpec.parts`) and runs on a backend of `PARTIAL_BACKENDS`
   moves only the parts the incoming job needs room for: its snapshots carry the tags to
   offload (the `offload_tags` option) and to discard (`discard_tags`).
3. Overlapped (the default): one `Switch` call per node, all nodes in parallel; each agent
   restores the incoming job while its snapshots run, admitting incoming bytes as outgoing
   bytes leave. A node's Switch is all or nothing; if any node fails, the nodes that went
   through are switched back (rollback epoch), so the outgoing jobs run on everywhere and
   the incoming job stays parked, and the failed half is reported (SnapshotFailed, or
   RestoreFailed with nothing evicted). An agent without `Switch` gets the serial calls.
4. Serial (`overlap=False`): `Snapshot` the evicted jobs everywhere in parallel (rolled back
   with `Restore` at the rollback epoch if any fails), then `Restore` the incoming job.
5. Report SwitchDone; the engine grants.

A prefetch (`Switch.purpose` is `SwitchKind.PREFETCH`) is planned by
`core.moves.plan_prefetch` (the holder is never evicted for it) and executed the same way;
when it cannot fit the coordinator says so (PrefetchSkipped) and nothing moves onto the
devices; the agents where the waiter is parked read its spilled parts back from their disk
tier into host memory instead (`Prefetch`), so its restore reads no disk. An
unprefetch parks a prefetched waiter that left (`core.moves.plan_park`).

Steps 3 and 4 (running the planned moves) live in `_moving.py`, which `Coordinator`
inherits; what the calls' outcomes mean (snapshot or restore failure, which jobs are
unsure) is the pure `core.settle`. Every call has a deadline; UNAVAILABLE is retried with exponential backoff. A
group with no agents never reaches here: its switch is a pure lock handoff.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from rlslice._errors import NotFoundError
from rlslice.adapters.channel import open_channel
from rlslice.adapters.tracing import SWITCH, span
from rlslice.config import GroupSpec, MoveClass, StatePart, TLSConfig
from rlslice.scheduler._moving import FENCE_OPTION, AgentCallError, _Moving, tier_moves
from rlslice.scheduler.clock import LoopClock
from rlslice.scheduler.core import GroupState, Switch, SwitchKind, agent_liveness, events
from rlslice.scheduler.core.membership import group_nodes
from rlslice.scheduler.core.moves import (
    JobReport,
    MovePlan,
    Need,
    NodeReport,
    Place,
    evicts_every_candidate,
    on_devices,
    plan_park,
    plan_prefetch,
    plan_switch,
)
from rlslice.scheduler.core.registration import AgentSurvey
from rlslice.scheduler.store import AgentRecord
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

log = logging.getLogger(__name__)

PARTIAL_BACKENDS = frozenset({"sim", "app"})
"""Backends whose agents move a job's tagged parts one by one (issue 26: `sim` emulates them,
`app` offloads a workload's tensors by tag); a job of another backend moves whole, whatever
parts it declared (cuda and cuda-checkpoint move processes)."""

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE}
#: How a call that went out can end without an answer: what the node did is unknown.
_CUT_OFF = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
#: Channel states in which connecting failed (nothing is sent on them).
_CONNECT_FAILED = {grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN}
_PLACES = {
    apb.AGENT_JOB_STATE_RUNNING: Place.RUNNING,
    apb.AGENT_JOB_STATE_SAVING: Place.SAVING,
    apb.AGENT_JOB_STATE_PARKED: Place.PARKED,
    apb.AGENT_JOB_STATE_RESTORING: Place.RESTORING,
    apb.AGENT_JOB_STATE_FAULTED: Place.FAULTED,
}


@dataclass(frozen=True, slots=True)
class _Channel:
    address: str
    channel: grpc.aio.Channel
    stub: Any


@dataclass(frozen=True, slots=True)
class _NoRoom:
    """A prefetch found that a switch to `waiter` evicts every resident job."""

    waiter: str
    resident: frozenset[str]
    """The resident jobs then (the holder among them)."""
    on_devices: frozenset[str]
    """The group's jobs some node had on its devices then (a parked job is not)."""
    epoch: int
    """The epoch of the group's next switch, if nothing else moves before it."""


class Coordinator(_Moving):
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
        overlap: bool = True,
        clock: Callable[[], float] | None = None,
        agent_expiry_seconds: float | None = None,
    ) -> None:
        self.agents: dict[str, AgentRecord] = {}
        self.agent_expiry_seconds = agent_expiry_seconds
        """An agent not heard from (re-registered) for this long is expired; None: never."""
        self.groups: Callable[[], Sequence[GroupState]] = tuple
        """The groups' states now (the engine's): what tells whether a node holds state."""
        self.on_removed: Callable[[str], None] = lambda node: None
        """Told each node whose agent is removed (expired or `remove_agent`): the store."""
        self._token, self._tls = token, tls
        self._rpc_timeout, self._status_timeout = rpc_timeout, status_timeout
        self._retries, self._backoff = retries, backoff
        self.overlap = overlap
        """One Switch call per node (restore overlapping snapshots); False: serial calls."""
        self._clock: Callable[[], float] = clock if clock is not None else LoopClock()
        """Times switches; the engine's clock (the loop's) when the server builds both."""
        self._channels: dict[str, _Channel] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._pinned: dict[str, tuple[tuple[str, ...], Callable[[], bool]]] = {}
        """Group -> (nodes it keeps, whether state still holds it there): a group whose
        selector resolves to other nodes keeps the old ones while state is on them."""
        self._no_room: dict[str, _NoRoom] = {}
        """Group -> the waiter a prefetch just found no room for beside any resident job."""
        self._once_kept: dict[str, set[str]] = {}
        """Group -> nodes it kept once: releases still reach them (a job that left may have
        left a copy there; a node that never knew the job answers NOT_FOUND)."""

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

    def state_on(self, node: str) -> str | None:
        """Why `node` may not be dropped (a job's state is there), or None."""
        for state in sorted(self.groups(), key=lambda s: s.name):
            if node not in self._resolve(state.spec):
                continue
            for where, jobs in (
                ("parked", state.parked),
                ("faulted", sorted(state.faulted)),
                ("resident", state.resident),
            ):
                if jobs:
                    return f"job {jobs[0]} of group {state.name} is {where} on node {node}"
        return None

    def remove_agent(self, node: str) -> None:
        """Forget `node`'s agent (its channel closes); the caller checked `state_on`."""
        self.agents.pop(node, None)
        old = self._channels.pop(node, None)
        if old is not None:
            task = asyncio.ensure_future(old.channel.close(None))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self.on_removed(node)

    def expire_agents(self) -> list[str]:
        """Remove agents silent past `agent_expiry_seconds` that hold no job's state; an
        expired one that does is kept (a switch through it fails naming it) and logged."""
        heard = {node: agent.registered_at for node, agent in self.agents.items()}
        stale = agent_liveness.expired(heard, self._clock(), self.agent_expiry_seconds)
        remove, kept = agent_liveness.split(stale, self.state_on)
        for node in remove:
            log.warning("agent on node %s expired (not heard from): removed", node)
            self.remove_agent(node)
        for node, why in kept.items():
            log.warning("agent on node %s expired (not heard from) but kept: %s", node, why)
        return remove

    def nodes_for(self, spec: GroupSpec) -> tuple[str, ...]:
        """The group's nodes: its spec's `nodes`, else the registered agents whose labels
        match its node selector (all of them without one); see `core.membership`. A group
        pinned by `keep_nodes` answers its kept nodes while its state still holds them."""
        pinned = self._pinned.get(spec.name)
        if pinned is not None:
            nodes, holds = pinned
            if holds():
                return nodes
            del self._pinned[spec.name]
            self._once_kept.setdefault(spec.name, set()).update(nodes)
            log.info("group %s: no state left on its kept nodes %s", spec.name, list(nodes))
        if not spec.nodes:
            self.expire_agents()
        return self._resolve(spec)

    def _resolve(self, spec: GroupSpec) -> tuple[str, ...]:
        pinned = self._pinned.get(spec.name)
        if pinned is not None:
            return pinned[0]
        return group_nodes(spec, {node: agent.labels for node, agent in self.agents.items()})

    def keep_nodes(self, group: str, nodes: tuple[str, ...], holds: Callable[[], bool]) -> None:
        """Answer `nodes` for `group` while `holds()` (state parked on them) says so."""
        self._pinned[group] = (nodes, holds)

    async def close(self) -> None:
        """Close every channel."""
        channels = list(self._channels.values())
        self._channels.clear()
        await asyncio.gather(*(c.channel.close(None) for c in channels), *self._closing)

    def _connection(self, node: str) -> _Channel:
        record = self.agents.get(node)
        if record is None:
            raise AgentCallError(node, "no agent registered", None, "node unknown")
        cached = self._channels.get(node)
        if cached is None:
            channel = open_channel(record.address, tls=self._tls, token=self._token)
            cached = _Channel(record.address, channel, agent_pb2_grpc.AgentStub(channel))
            self._channels[node] = cached
        return cached

    async def _call(self, node: str, method: str, request: Any, timeout: float, what: str) -> Any:
        """One agent call with a deadline; UNAVAILABLE is retried with exponential backoff.

        The call goes out only on a connected channel, so how it failed says whether it
        was cut off: a channel that could not connect sent nothing (UNAVAILABLE, or
        DEADLINE_EXCEEDED while still connecting); a call that went out and got no answer
        (DEADLINE_EXCEEDED, UNAVAILABLE: the connection broke) may have done its work."""
        loop = asyncio.get_running_loop()
        for attempt in range(self._retries + 1):
            connection = self._connection(node)
            deadline = loop.time() + timeout
            state = await _connect(connection.channel, deadline)
            if state is not grpc.ChannelConnectivity.READY:
                code = (
                    grpc.StatusCode.UNAVAILABLE
                    if state in _CONNECT_FAILED
                    else grpc.StatusCode.DEADLINE_EXCEEDED
                )
                if code in _RETRYABLE and attempt < self._retries:
                    await asyncio.sleep(self._backoff * 2**attempt)
                    continue
                raise AgentCallError(node, what, code, f"not connected ({state.name})")
            try:
                call = getattr(connection.stub, method)
                return await call(request, timeout=max(deadline - loop.time(), 0.001))
            except grpc.aio.AioRpcError as error:
                if error.code() in _RETRYABLE and attempt < self._retries:
                    await asyncio.sleep(self._backoff * 2**attempt)
                    continue
                cut_off = error.code() in _CUT_OFF
                raise AgentCallError(
                    node, what, error.code(), error.details() or "", cut_off=cut_off
                ) from None
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
        splittable = _splittable_parts(spec)
        candidates = switch.candidates
        blind = self._blind_candidates(state, switch, splittable)
        if blind is not None:
            # The same plan as from fresh reports, without the Status round (~2 ms of a
            # zero-byte switch through three agents): every node gets the calls, and one
            # where a job is not (or no longer) running finds nothing to do. A job the
            # prefetch found parked everywhere is left out: there is nothing of it to
            # snapshot, and its agent would refuse a second snapshot.
            candidates = blind
            reports = [NodeReport(node, answered=False) for node in nodes]
        else:
            statuses = await self._statuses(nodes)
            reports = [_report(node, statuses.get(node), state.name) for node in nodes]
        record = state.jobs.get(switch.incoming)
        need = Need(
            switch.incoming,
            record.device_bytes if record else 0,
            switch.restore,
            sum(
                p.bytes
                for p in splittable.get(switch.incoming, ())
                if p.move_class is MoveClass.DISCARD
            ),
        )
        plan: MovePlan | None
        if switch.purpose == SwitchKind.UNPREFETCH:
            plan = plan_park(switch.incoming, reports)
        elif switch.purpose == SwitchKind.PREFETCH:
            holding = state.jobs.get(state.holder) if state.holder is not None else None
            plan = plan_prefetch(
                need,
                reports,
                switch.candidates,
                holder=state.holder,
                headroom_bytes=spec.headroom_bytes,
                holder_declared_bytes=holding.device_bytes if holding is not None else 0,
            )
            if plan is None:
                self._remember_no_room(state, switch, need, reports)
                filled = await self._fill_ahead(state.name, switch.incoming, reports)
                return events.PrefetchSkipped(
                    switch.epoch, "does not fit beside the holder", filled
                )
        else:
            plan = plan_switch(
                need,
                reports,
                candidates,
                must_evict=switch.evict,
                headroom_bytes=spec.headroom_bytes,
                parts=splittable,
            )
        if self.overlap and not switch.fence:
            result = await self._overlapped(spec, switch, plan)
        else:
            # A fence (a lapsed holder) is never undone, so it takes the serial calls,
            # whose snapshots hold even when the restore fails.
            result = await self._serial(spec, switch, plan)
        if isinstance(result, events.SwitchDone):
            return dataclasses.replace(result, seconds=self._clock() - started)
        return result

    def _remember_no_room(
        self, state: GroupState, switch: Switch, need: Need, reports: Sequence[NodeReport]
    ) -> None:
        """After a prefetch that could not fit: remember when no resident job, the holder
        included, can stay beside the waiter, for the switch to it that follows."""
        everyone = (*switch.candidates, *([state.holder] if state.holder else []))
        if all(r.answered for r in reports) and evicts_every_candidate(
            need, reports, everyone, headroom_bytes=state.spec.headroom_bytes
        ):
            self._no_room[state.name] = _NoRoom(
                switch.incoming,
                frozenset(state.resident),
                on_devices(reports, (*state.resident, *state.parked)),
                switch.rollback_epoch + 1,
            )

    def _blind_candidates(
        self, state: GroupState, switch: Switch, splittable: dict[str, tuple[StatePart, ...]]
    ) -> tuple[str, ...] | None:
        """When `switch` is the grant that follows a prefetch found no room beside its
        waiter, nothing between (no other switch: the epoch is the next one; the same
        resident jobs), it evicts every candidate on the devices whatever the numbers are
        now: those candidates, to plan without a Status round. None otherwise, and when a
        candidate moves by parts (how many of its parts go depends on the numbers)."""
        known = self._no_room.pop(state.name, None)
        if (
            known is None
            or switch.purpose != SwitchKind.GRANT
            or known.waiter != switch.incoming
            or known.epoch != switch.epoch
            or not set(state.resident) - {switch.incoming} <= known.resident
            or any(j in splittable for j in (*switch.evict, *switch.candidates))
        ):
            return None
        # Left out: only a job the group has parked that no node had on its devices then.
        return tuple(j for j in switch.candidates if j in state.resident or j in known.on_devices)

    async def _fill_ahead(
        self, group: str, job: str, reports: Sequence[NodeReport]
    ) -> tuple[events.NodeMove, ...]:
        """A waiter that does not fit beside the holder: each node where it is parked reads
        its spilled parts back into host memory now (`Prefetch`), so its restore reads no
        disk. Best effort: a node that fails (or predates the call) is logged, and the
        restore fills from disk there as before. The agents' moves, for the spill lane."""
        # Only nodes that answered this round's Status: asking one that did not would hold
        # the switch slot for its whole deadline and retries, for a fill that is only
        # an optimisation (the restore fills from disk anyway).
        parked = [
            r.node
            for r in reports
            if r.answered and (j := r.jobs.get(job)) and j.place is Place.PARKED
        ]
        request = apb.PrefetchRequest(job=job, group=group)

        async def one(node: str) -> tuple[events.NodeMove, ...]:
            try:
                result = await self._call(
                    node, "Prefetch", request, self._rpc_timeout, f"prefetch of {job}"
                )
            except AgentCallError as error:
                log.info("%s", error)
                return ()
            return tier_moves(node, result.tier_moves)

        found = await asyncio.gather(*(one(node) for node in parked))
        return tuple(m for moves in found for m in moves)

    async def survey(self, spec: GroupSpec) -> AgentSurvey:
        """One Status to each node of the group, for a registration: the (job, group)
        pairs each node that answered knows (see `core.registration`), and the host bytes
        each node can give the group's parked state: what its agent reports available
        now, plus what the group parks there already. A node that does not answer counts
        with the host memory it reported at registration; a node that never reported host
        memory (0, the wire's "unset") is left out (unknown)."""
        nodes = self.nodes_for(spec)
        statuses = await self._statuses(nodes)
        jobs = {node: tuple((j.job, j.group) for j in s.jobs) for node, s in statuses.items()}
        parking: dict[str, int] = {}
        for node in nodes:
            status = statuses.get(node)
            if status is not None and status.host_available_bytes > 0:
                mine = sum(j.host_bytes for j in status.jobs if j.group == spec.name)
                parking[node] = status.host_available_bytes + mine
            elif (record := self.agents.get(node)) is not None and record.host_available_bytes:
                parking[node] = record.host_available_bytes
        return AgentSurvey(jobs, parking)

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
                quiet = issubclass(error.error, NotFoundError)
                log.log(logging.DEBUG if quiet else logging.WARNING, "%s", error)

        nodes = self.nodes_for(spec)
        pinned = self._pinned.get(spec.name)
        kept = self._once_kept.get(spec.name, set()) | set(pinned[0] if pinned else ())
        nodes = (*nodes, *sorted(kept - set(nodes)))
        await asyncio.gather(*(one(node) for node in nodes))


async def _connect(channel: grpc.aio.Channel, deadline: float) -> grpc.ChannelConnectivity:
    """Wait until `channel` is connected, connecting failed, or the loop's time reaches
    `deadline`; the state it is in then."""
    loop = asyncio.get_running_loop()
    state = channel.get_state(try_to_connect=True)
    while state is not grpc.ChannelConnectivity.READY and state not in _CONNECT_FAILED:
        left = deadline - loop.time()
        if left <= 0:
            return state
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), left)
        except TimeoutError:
            return channel.get_state()
        state = channel.get_state(try_to_connect=True)
    return state


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


def _report(node: str, status: apb.AgentStatus | None, group: str) -> NodeReport:
    """A node's Status as the planner's plain report (answered=False when it was silent)."""
    if status is None:
        return NodeReport(node, answered=False)
    jobs = {
        j.job: JobReport(_PLACES.get(j.state, Place.FAULTED), j.device_bytes, j.host_bytes)
        for j in status.jobs
        if j.group == group
    }
    free = tuple(d.total_bytes - d.used_bytes for d in status.devices)
    host = status.host_available_bytes if status.host_available_bytes > 0 else None
    return NodeReport(node, True, free, jobs, host)


def _splittable_parts(spec: GroupSpec) -> dict[str, tuple[StatePart, ...]]:
    """The parts the group's jobs declared, for those whose backend moves parts
    (`PARTIAL_BACKENDS`); the others move whole."""
    return {
        job.name: job.parts
        for job in spec.jobs
        if job.parts and (job.backend or spec.backend) in PARTIAL_BACKENDS
    }


__all__ = ["FENCE_OPTION", "AgentCallError", "Coordinator"]
