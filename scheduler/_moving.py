"""How a coordinator moves state for one switch, once it is planned: overlapped (one
`Switch` call per node, switched back on every node if one fails) or serial (snapshots
everywhere, rolled back if one fails, then the restore). It only runs the calls and the
undoing; what they mean for the core is `core.settle`. `Coordinator` inherits it; see its
module docstring for the steps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from rlslice._errors import (
    AbortedError,
    ResourceExhaustedError,
    RlsliceError,
    UnavailableError,
)
from rlslice.adapters.grpc_errors import error_for_code
from rlslice.config import OFFLOAD_TAGS_OPTION, GroupSpec
from rlslice.scheduler.core import Switch, events
from rlslice.scheduler.core.events import MoveKind
from rlslice.scheduler.core.moves import MovePlan, NodeMoves
from rlslice.scheduler.core.parts import PartPlan
from rlslice.scheduler.core.settle import CallFailure, NodeOutcome, Undo, UndoKind, settle
from rlslice.v1alpha1 import agent_pb2 as apb

log = logging.getLogger("rlslice.scheduler.coordinator")


#: Backend option of a snapshot that fences a job whose lease lapsed while it held: it may
#: be mid-step, so the backend stops its processes before anything moves (`app`: frozen,
#: no offload under a running step).
FENCE_OPTION = "fence"
#: The agent's RPC for each half of a switch, called alone (serial).
_RPC = {MoveKind.SNAPSHOT: "Snapshot", MoveKind.RESTORE: "Restore"}


class AgentCallError(Exception):
    """One agent call failed for good. `code` is None when no call was made (no agent
    registered, the channel could not connect); `cut_off` says whether the call went out
    on a connected channel and no answer came back, so what the node did is unknown."""

    def __init__(
        self,
        node: str,
        what: str,
        code: grpc.StatusCode | None,
        detail: str,
        *,
        cut_off: bool = False,
        error: type[RlsliceError] | None = None,
    ) -> None:
        self.node, self.code, self.detail, self.cut_off = node, code, detail, cut_off
        self.error: type[RlsliceError] = error or (
            error_for_code(code) if code is not None else UnavailableError
        )
        """What the failure means, through the one translator (no call made: UNAVAILABLE)."""
        name = code.name if code else "UNAVAILABLE"
        super().__init__(f"node {node}: {what}: {name}: {detail}")

    @property
    def failure(self) -> CallFailure:
        """The failure as the pure `settle` reads it."""
        return CallFailure(str(self), self.error, self.cut_off)


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
        partial = {(job, n.node): p for n in plan.nodes for job, p in n.partial.items()}
        results = await self._moves(
            MoveKind.SNAPSHOT, spec, snapshots, switch.epoch, switch.fence, partial
        )
        outcomes = _call_outcomes(MoveKind.SNAPSHOT, snapshots, results)
        if any(o.failure is not None for o in outcomes):
            # A fenced job (its lease lapsed while it held) stays fenced where it is: rolling
            # it back would let a holder nobody can reach run beside the next one.
            done = [
                (job, o.node)
                for (job, _), o in zip(snapshots, outcomes, strict=True)
                if o.snapped and job not in switch.fence
            ]
            left = await self._rollback(spec, done, switch.rollback_epoch)
            return settle(
                switch.epoch, plan, outcomes, Undo(UndoKind.ROLLED_BACK, len(done), tuple(left))
            )
        restores = [(n.restore, n.node) for n in plan.nodes if n.restore is not None]
        results = await self._moves(MoveKind.RESTORE, spec, restores, switch.epoch)
        outcomes += _call_outcomes(MoveKind.RESTORE, restores, results)
        return settle(switch.epoch, plan, outcomes, None)  # a failed restore is not undone

    async def _overlapped(self, spec: GroupSpec, switch: Switch, plan: MovePlan) -> events.Event:
        """One Switch per node, in parallel; all nodes or none (see the module docstring)."""
        outcomes = await asyncio.gather(
            *(self._node_switch(spec, moves, switch.epoch) for moves in plan.nodes)
        )
        if not any(o.failure is not None for o in outcomes):
            return settle(switch.epoch, plan, outcomes, Undo(UndoKind.SWITCHED_BACK, 0))
        went = [o for o in outcomes if o.failure is None and o.moved_any]
        left = await asyncio.gather(
            *(self._switch_back(spec, o, switch.rollback_epoch) for o in went)
        )
        undo = Undo(UndoKind.SWITCHED_BACK, len(went), tuple(j for js in left for j in js))
        return settle(switch.epoch, plan, outcomes, undo)

    async def _node_switch(self, spec: GroupSpec, moves: NodeMoves, epoch: int) -> NodeOutcome:
        node = moves.node
        request = apb.SwitchRequest(
            group=spec.name,
            epoch=epoch,
            outgoing=[
                self._switch_move(spec, job, moves.partial.get(job)) for job in moves.snapshot
            ],
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
            return NodeOutcome(node, failure=refused.failure, unsure=unsure)
        moved = sum(r.bytes for r in result.outgoing)
        restored = result.HasField("incoming") and not result.incoming.absent
        came_back = result.incoming.bytes if restored else 0
        if result.HasField("failure"):
            failure = result.failure
            kind = ResourceExhaustedError if failure.resource_exhausted else AbortedError
            code = (
                grpc.StatusCode.RESOURCE_EXHAUSTED
                if failure.resource_exhausted
                else grpc.StatusCode.ABORTED
            )
            detail = f"{failure.move} of job {failure.job} failed (undone): {failure.reason}"
            error = AgentCallError(node, what, code, detail, error=kind)
            half = MoveKind.SNAPSHOT if failure.move == MoveKind.SNAPSHOT else MoveKind.RESTORE
            return NodeOutcome(node, failure=error.failure, failed_move=half)
        snapped = tuple(r.job for r in result.outgoing if not r.absent)
        done = _node_moves(
            MoveKind.SNAPSHOT, [(r.job, node) for r in result.outgoing], list(result.outgoing)
        )
        if restored:
            done += _node_moves(MoveKind.RESTORE, [(result.incoming.job, node)], [result.incoming])
        return NodeOutcome(
            node,
            moved + came_back,
            came_back,
            snapped,
            result.incoming.job if restored else None,
            done=done,
        )

    async def _node_serial(self, spec: GroupSpec, moves: NodeMoves, epoch: int) -> NodeOutcome:
        """A node whose agent has no Switch: its snapshots, then its restore, undone on failure."""
        node = moves.node
        pairs = [(job, node) for job in moves.snapshot]
        partial = {(job, node): p for job, p in moves.partial.items()}
        snapped_results = await self._moves(MoveKind.SNAPSHOT, spec, pairs, epoch, (), partial)
        calls = _call_outcomes(MoveKind.SNAPSHOT, pairs, snapped_results)
        if all(o.failure is None for o in calls) and moves.restore is not None:
            (result,) = await self._moves(MoveKind.RESTORE, spec, [(moves.restore, node)], epoch)
            calls += _call_outcomes(MoveKind.RESTORE, [(moves.restore, node)], [result])
        snapped = tuple(job for o in calls for job in o.snapped)
        failed = next((o for o in calls if o.failure is not None), None)
        if failed is not None:
            left = await self._rollback(spec, [(job, node) for job in snapped], epoch + 1)
            cut = (j for o in calls if o.failed_move is MoveKind.SNAPSHOT for j in o.unsure)
            unsure = tuple(dict.fromkeys([*cut, *left]))
            return NodeOutcome(
                node, failure=failed.failure, failed_move=failed.failed_move, unsure=unsure
            )
        restored = next((o.restored for o in calls if o.restored is not None), None)
        return NodeOutcome(
            node,
            sum(o.moved for o in calls),
            sum(o.restored_bytes for o in calls),
            snapped,
            restored,
            done=tuple(m for o in calls for m in o.done),
        )

    async def _switch_back(self, spec: GroupSpec, outcome: NodeOutcome, epoch: int) -> list[str]:
        """Undo a node's switch that went through: park the incoming job again, then
        bring the outgoing jobs back (serial calls: the rare path). The jobs left parked."""
        node = outcome.node
        if outcome.restored is not None:
            pair = [(outcome.restored, node)]
            (result,) = await self._moves(MoveKind.SNAPSHOT, spec, pair, epoch)
            if isinstance(result, AgentCallError):
                log.error("switching node %s back failed: %s", node, result)
                # The outgoing jobs stay parked there; their next grant restores them.
                return list(outcome.snapped)
        return await self._rollback(spec, [(job, node) for job in outcome.snapped], epoch)

    def _switch_move(
        self, spec: GroupSpec, job: str, part: PartPlan | None = None
    ) -> apb.SwitchMove:
        backend = spec.job(job).backend or spec.backend
        options = _part_options(spec.backend_options, part)
        discard = list(part.discard) if part is not None else []
        return apb.SwitchMove(job=job, backend=backend, options=options, discard_tags=discard)

    async def _moves(
        self,
        move: MoveKind,
        spec: GroupSpec,
        pairs: list[tuple[str, str]],
        epoch: int,
        fence: tuple[str, ...] = (),
        partial: Mapping[tuple[str, str], PartPlan] | None = None,
    ) -> list[apb.MoveResult | AgentCallError]:
        """The calls of `move` for `pairs` (job, node), at once; `partial`: the snapshots
        that move only some parts, by (job, node)."""

        async def one(job: str, node: str) -> apb.MoveResult | AgentCallError:
            backend = spec.job(job).backend or spec.backend
            part = (partial or {}).get((job, node)) if move is MoveKind.SNAPSHOT else None
            options = _part_options(spec.backend_options, part)
            if job in fence:
                options[FENCE_OPTION] = "1"  # the backend stops the job before moving anything
            request: Any
            if move is MoveKind.SNAPSHOT:
                request = apb.SnapshotRequest(
                    job=job,
                    group=spec.name,
                    epoch=epoch,
                    backend=backend,
                    options=options,
                    discard_tags=list(part.discard) if part is not None else [],
                )
            else:
                request = apb.RestoreRequest(
                    job=job, group=spec.name, epoch=epoch, backend=backend, options=options
                )
            what = f"{move} of job {job}"
            try:
                result: apb.MoveResult = await self._call(
                    node, _RPC[move], request, self._rpc_timeout, what
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
        results = await self._moves(MoveKind.RESTORE, spec, done, epoch)
        left = []
        for (job, node), result in zip(done, results, strict=True):
            if isinstance(result, AgentCallError):
                log.error("rollback of job %s on node %s failed: %s", job, node, result)
                left.append(job)
        return left


def _part_options(options: Mapping[str, str], part: PartPlan | None) -> dict[str, str]:
    """The group's backend options, with a partial snapshot's offload tags (the option's
    presence makes the snapshot partial; its discard tags travel in `discard_tags`)."""
    given = dict(options)
    if part is not None:
        given[OFFLOAD_TAGS_OPTION] = ",".join(part.offload)
    return given


def _call_outcomes(
    move: MoveKind,
    pairs: Sequence[tuple[str, str]],
    results: Sequence[apb.MoveResult | AgentCallError],
) -> list[NodeOutcome]:
    """One outcome per serial call of `move` for `pairs` (job, node)."""
    outcomes = []
    for (job, node), result in zip(pairs, results, strict=True):
        if isinstance(result, AgentCallError):
            unsure = (job,) if result.cut_off else ()
            outcomes.append(
                NodeOutcome(node, failure=result.failure, failed_move=move, unsure=unsure)
            )
            continue
        moved = not result.absent
        outcomes.append(
            NodeOutcome(
                node,
                result.bytes,
                result.bytes if move is MoveKind.RESTORE else 0,
                (job,) if moved and move is MoveKind.SNAPSHOT else (),
                job if moved and move is MoveKind.RESTORE else None,
                done=_node_moves(move, [(job, node)], [result]),
            )
        )
    return outcomes


def _node_moves(
    move: MoveKind, pairs: Sequence[tuple[str, str]], results: Sequence[object]
) -> tuple[events.NodeMove, ...]:
    """The moves that took place among `results` of the calls for `pairs` (job, node):
    answered, not absent there, not a repeat of an earlier call; and the moves between
    host memory and disk each answer tells (`tier_moves`)."""
    done: list[events.NodeMove] = []
    for (job, node), r in zip(pairs, results, strict=True):
        if isinstance(r, apb.MoveResult) and not r.repeated:
            done += tier_moves(node, r.tier_moves)
            if not r.absent:
                done.append(events.NodeMove(node, job, move, r.bytes, r.seconds))
    return tuple(done)


_TIER = {"spill": MoveKind.SPILL, "fill": MoveKind.FILL}


def tier_moves(node: str, moves: Sequence[apb.TierMove]) -> tuple[events.NodeMove, ...]:
    """The agent's moves between host memory and its disk tier, as the core's moves."""
    return tuple(
        events.NodeMove(node, m.job, _TIER[m.direction], m.bytes, m.seconds)
        for m in moves
        if m.direction in _TIER
    )
