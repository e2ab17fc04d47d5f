"""How a coordinator moves state for one switch, once it is planned: overlapped (one
`Switch` call per node, switched back on every node if one fails) or serial (snapshots
everywhere, rolled back if one fails, then the restore), and what each node's calls did.
`Coordinator` inherits it; see its module docstring for the steps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from rlslice._errors import (
    AbortedError,
    FailedPreconditionError,
    ResourceExhaustedError,
    RlsliceError,
)
from rlslice.config import GroupSpec
from rlslice.scheduler.core import Switch, events
from rlslice.scheduler.core.moves import MovePlan, NodeMoves
from rlslice.v1alpha1 import agent_pb2 as apb

log = logging.getLogger("rlslice.scheduler.coordinator")


#: Backend option of a snapshot that fences a job whose lease lapsed while it held: it may
#: be mid-step, so the backend stops its processes before anything moves (`app`: frozen,
#: no offload under a running step).
FENCE_OPTION = "fence"
_TRANSPORT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class AgentCallError(Exception):
    """One agent call failed for good."""

    def __init__(self, node: str, what: str, code: grpc.StatusCode | None, detail: str) -> None:
        self.node, self.code, self.detail = node, code, detail
        name = code.name if code else "UNAVAILABLE"
        super().__init__(f"node {node}: {what}: {name}: {detail}")

    @property
    def cut_off(self) -> bool:
        """The call may have reached the agent but no answer came back (its deadline
        passed, the connection broke mid-call): what the node did is unknown. A call that
        never connected (refused, no agent registered) did nothing there."""
        if self.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return True
        return self.code == grpc.StatusCode.UNAVAILABLE and "failed to connect" not in (
            self.detail.lower()
        )

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


class _Moving:
    """Running a planned switch over the agents, for `Coordinator` (which sets these)."""

    _rpc_timeout: float

    if TYPE_CHECKING:

        async def _call(
            self, node: str, method: str, request: Any, timeout: float, what: str
        ) -> Any: ...

    async def _serial(self, spec: GroupSpec, switch: Switch, plan: MovePlan) -> events.Event:
        """Snapshots everywhere, then restores (rolling the snapshots back if one fails)."""
        snapshots = [(job, n.node) for n in plan.nodes for job in n.snapshot]
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
            left = await self._rollback(spec, done, switch.rollback_epoch)
            reason = "; ".join(str(f) for f in failures)
            if done:
                reason += f" (rolled back on {len(done)} node(s))"
            cut = [
                job
                for (job, _), r in zip(snapshots, results, strict=True)
                if isinstance(r, AgentCallError) and r.cut_off
            ]
            unsure = _unique(*cut, *left)
            return events.SnapshotFailed(switch.epoch, reason, failures[0].kind, unsure)
        moved = sum(r.bytes for r in results if isinstance(r, apb.MoveResult))
        took_place = _node_moves(snapshots, results, restore=False)
        restores = [(n.restore, n.node) for n in plan.nodes if n.restore is not None]
        results = await self._moves("Restore", spec, restores, switch.epoch)
        failures = [r for r in results if isinstance(r, AgentCallError)]
        restored = sum(r.bytes for r in results if isinstance(r, apb.MoveResult))
        moved += restored
        if failures:
            reason = "; ".join(str(f) for f in failures)
            return events.RestoreFailed(switch.epoch, reason, plan.evict, moved)
        took_place += _node_moves(restores, results, restore=True)
        return events.SwitchDone(
            switch.epoch, plan.evict, moved, restored_bytes=restored, moves=took_place
        )

    async def _overlapped(self, spec: GroupSpec, switch: Switch, plan: MovePlan) -> events.Event:
        """One Switch per node, in parallel; all nodes or none (see the module docstring)."""
        outcomes = await asyncio.gather(
            *(self._node_switch(spec, moves, switch.epoch) for moves in plan.nodes)
        )
        failed = [o for o in outcomes if o.failure is not None]
        if not failed:
            moved = sum(o.moved for o in outcomes)
            restored = sum(o.restored_bytes for o in outcomes)
            done = tuple(m for o in outcomes for m in o.done)
            return events.SwitchDone(
                switch.epoch, plan.evict, moved, restored_bytes=restored, moves=done
            )
        went = [o for o in outcomes if o.failure is None and o.moved_any]
        left = await asyncio.gather(
            *(self._switch_back(spec, o, switch.rollback_epoch) for o in went)
        )
        reason = "; ".join(str(o.failure) for o in failed)
        if went:
            reason += f" (switched back on {len(went)} node(s))"
        unsure = _unique(*(j for o in failed for j in o.unsure), *(j for js in left for j in js))
        snapshots = [o.failure for o in failed if o.failed_move == "snapshot" and o.failure]
        if snapshots:
            return events.SnapshotFailed(switch.epoch, reason, snapshots[0].kind, unsure)
        if unsure:
            return events.SnapshotFailed(switch.epoch, reason, failed[0].failure.kind, unsure)  # type: ignore[union-attr]
        # Undone everywhere: nothing was evicted, so a retry may evict again.
        return events.RestoreFailed(switch.epoch, reason, (), 0)

    async def _node_switch(self, spec: GroupSpec, moves: NodeMoves, epoch: int) -> _NodeOutcome:
        node = moves.node
        request = apb.SwitchRequest(
            group=spec.name,
            epoch=epoch,
            outgoing=[self._switch_move(spec, job) for job in moves.snapshot],
            headroom_bytes=spec.headroom_bytes,
        )
        if moves.restore is not None:
            request.incoming.CopyFrom(self._switch_move(spec, moves.restore))
        what = f"switch to job {moves.restore or '-'}"
        try:
            result: apb.SwitchResult = await self._call(
                node, "Switch", request, self._rpc_timeout, what
            )
        except AgentCallError as refused:
            if refused.code == grpc.StatusCode.UNIMPLEMENTED:
                return await self._node_serial(spec, moves, epoch)
            # Refused before anything moved, or cut off: counted as the snapshot half. Cut
            # off, the node may have switched all the same: its outgoing jobs are unsure.
            unsure = moves.snapshot if refused.cut_off else ()
            return _NodeOutcome(moves, failure=refused, failed_move="snapshot", unsure=unsure)
        moved = sum(r.bytes for r in result.outgoing)
        restored = result.HasField("incoming") and not result.incoming.absent
        came_back = result.incoming.bytes if restored else 0
        if result.HasField("failure"):
            failure = result.failure
            code = (
                grpc.StatusCode.RESOURCE_EXHAUSTED
                if failure.resource_exhausted
                else grpc.StatusCode.ABORTED
            )
            detail = f"{failure.move} of job {failure.job} failed (undone): {failure.reason}"
            error = AgentCallError(node, what, code, detail)
            return _NodeOutcome(moves, failure=error, failed_move=failure.move)
        snapped = tuple(r.job for r in result.outgoing if not r.absent)
        done = _node_moves([(r.job, node) for r in result.outgoing], list(result.outgoing), False)
        if restored:
            done += _node_moves([(result.incoming.job, node)], [result.incoming], True)
        return _NodeOutcome(moves, moved + came_back, snapped, restored, came_back, done=done)

    async def _node_serial(self, spec: GroupSpec, moves: NodeMoves, epoch: int) -> _NodeOutcome:
        """A node whose agent has no Switch: its snapshots, then its restore, undone on failure."""
        node = moves.node
        pairs = [(job, node) for job in moves.snapshot]
        results = await self._moves("Snapshot", spec, pairs, epoch)
        snapped = tuple(
            job
            for (job, _), r in zip(pairs, results, strict=True)
            if isinstance(r, apb.MoveResult) and not r.absent
        )
        moved = sum(r.bytes for r in results if isinstance(r, apb.MoveResult))
        failure = next((r for r in results if isinstance(r, AgentCallError)), None)
        failed_move = "snapshot"
        restored, came_back = False, 0
        done = _node_moves(pairs, results, restore=False)
        if failure is None and moves.restore is not None:
            (result,) = await self._moves("Restore", spec, [(moves.restore, node)], epoch)
            if isinstance(result, AgentCallError):
                failure, failed_move = result, "restore"
            else:
                restored, came_back = not result.absent, result.bytes
                done += _node_moves([(moves.restore, node)], [result], restore=True)
        if failure is not None:
            left = await self._rollback(spec, [(job, node) for job in snapped], epoch + 1)
            cut = tuple(j for (j, _), r in zip(pairs, results, strict=True) if _cut(r))
            unsure = _unique(*cut, *left)
            return _NodeOutcome(moves, failure=failure, failed_move=failed_move, unsure=unsure)
        return _NodeOutcome(moves, moved + came_back, snapped, restored, came_back, done=done)

    async def _switch_back(self, spec: GroupSpec, outcome: _NodeOutcome, epoch: int) -> list[str]:
        """Undo a node's switch that went through: park the incoming job again, then
        bring the outgoing jobs back (serial calls: the rare path). The jobs left parked."""
        node = outcome.moves.node
        if outcome.restored and outcome.moves.restore is not None:
            (result,) = await self._moves("Snapshot", spec, [(outcome.moves.restore, node)], epoch)
            if isinstance(result, AgentCallError):
                log.error("switching node %s back failed: %s", node, result)
                # The outgoing jobs stay parked there; their next grant restores them.
                return list(outcome.snapped)
        return await self._rollback(spec, [(job, node) for job in outcome.snapped], epoch)

    def _switch_move(self, spec: GroupSpec, job: str) -> apb.SwitchMove:
        backend = spec.job(job).backend or spec.backend
        return apb.SwitchMove(job=job, backend=backend, options=dict(spec.backend_options))

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

    async def _rollback(
        self, spec: GroupSpec, done: list[tuple[str, str]], epoch: int
    ) -> list[str]:
        """Undo snapshots that succeeded, so the outgoing job runs on everywhere; the jobs
        whose rollback failed (parked there still: reported unsure, their next grant
        restores them)."""
        results = await self._moves("Restore", spec, done, epoch)
        left = []
        for (job, node), result in zip(done, results, strict=True):
            if isinstance(result, AgentCallError):
                log.error("rollback of job %s on node %s failed: %s", job, node, result)
                left.append(job)
        return left


def _node_moves(
    pairs: Sequence[tuple[str, str]], results: Sequence[object], restore: bool
) -> tuple[events.NodeMove, ...]:
    """The moves that took place among `results` of the calls for `pairs` (job, node):
    answered, not absent there, not a repeat of an earlier call."""
    return tuple(
        events.NodeMove(node, job, restore, r.bytes, r.seconds)
        for (job, node), r in zip(pairs, results, strict=True)
        if isinstance(r, apb.MoveResult) and not r.absent and not r.repeated
    )


def _cut(result: object) -> bool:
    return isinstance(result, AgentCallError) and result.cut_off


def _unique(*jobs: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(jobs))


@dataclass(frozen=True, slots=True)
class _NodeOutcome:
    """How one node's Switch went."""

    moves: NodeMoves
    moved: int = 0
    snapped: tuple[str, ...] = ()
    """Jobs snapshotted there (not absent)."""
    restored: bool = False
    restored_bytes: int = 0
    failure: AgentCallError | None = None
    failed_move: str = ""
    unsure: tuple[str, ...] = ()
    """Jobs that may be parked there after all (cut off mid-call, a failed rollback)."""
    done: tuple[events.NodeMove, ...] = ()
    """The moves that took place there."""

    @property
    def moved_any(self) -> bool:
        return bool(self.snapped) or self.restored
