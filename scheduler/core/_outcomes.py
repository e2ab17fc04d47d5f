"""What the coordinator reports about a switch: done, skipped, failed (retried up to
`MAX_SWITCH_ATTEMPTS`), or its restore failed; and what each does to the state.
"""

from __future__ import annotations

from typing import Any

from rlslice._errors import FailedPreconditionError, RlsliceError
from rlslice.scheduler.core import actions as a
from rlslice.scheduler.core import events as ev
from rlslice.scheduler.core._dispatch import _grant, _retry, _serve, _undo_preempt
from rlslice.scheduler.core._holds import _note_parts, _park, _place_parked, _place_resident
from rlslice.scheduler.core._tx import _Tx
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.state import GroupState, Switch, SwitchKind

#: A switch that fails is tried this many times in all before its waiter fails.
MAX_SWITCH_ATTEMPTS = 2


def _current_switch(s: GroupState, epoch: int) -> Switch | None:
    """The switch a coordinator report is about, or None for a stale report."""
    return s.switch if s.switch is not None and s.switch.epoch == epoch else None


def _switch_done(tx: _Tx, e: ev.SwitchDone) -> None:
    s = tx.s
    switch = _current_switch(s, e.epoch)
    if switch is None:
        return
    _record_moves(tx, e.moves)
    _note_parts(tx, e.parts)
    if switch.purpose != SwitchKind.GRANT:
        _side_switch_done(tx, switch, e)
        return
    _park(tx, e.evicted)
    _fenced(tx, switch)
    incoming = switch.incoming
    s = tx.s
    if incoming in s.jobs:
        _place_resident(tx, incoming)
    tx.set(
        switch=None,
        switches=s.switches + 1,
        last_switch_seconds=e.seconds,
        last_switch_at=tx.now,
    )
    tx.record(Kind.SWITCH_DONE, incoming, seconds=e.seconds, nbytes=e.moved_bytes)
    if (switch.ticket is not None or switch.detached) and incoming in s.jobs:
        _grant(
            tx,
            incoming,
            switch.ticket,
            tx.now - switch.waited_since,
            restored=switch.restore and _came_back(e) > 0,
            switch_seconds=e.seconds,
            moved_bytes=e.moved_bytes,
            reserved=True,
            phase=switch.phase,
        )
    else:
        _serve(tx)


_DONE = {
    ev.MoveKind.SNAPSHOT: Kind.SNAPSHOT_DONE,
    ev.MoveKind.RESTORE: Kind.RESTORE_DONE,
    ev.MoveKind.SPILL: Kind.SPILL_DONE,
    ev.MoveKind.FILL: Kind.FILL_DONE,
}


def _record_moves(tx: _Tx, moves: tuple[ev.NodeMove, ...]) -> None:
    """One ring event per node and move (the node in `detail`): the timeline's moves lane
    and its spill lane (the agents' moves between host memory and disk)."""
    for move in moves:
        tx.record(_DONE[move.move], move.job, move.node, seconds=move.seconds, nbytes=move.bytes)


def _came_back(e: ev.SwitchDone) -> int:
    return e.moved_bytes if e.restored_bytes is None else e.restored_bytes


def _side_switch_done(tx: _Tx, switch: Switch, e: ev.SwitchDone) -> None:
    """A prefetch brought its waiter onto the GPUs (granted at once when the holder has
    yielded meanwhile), or an unprefetch parked a waiter that left."""
    _park(tx, e.evicted)
    job = switch.incoming
    s = tx.s
    if switch.purpose == SwitchKind.PREFETCH and job in s.jobs:
        _place_resident(tx, job)
        tx.set(prefetched=(*(j for j in s.prefetched if j != job), job))
    detail = "done" if switch.purpose == SwitchKind.PREFETCH else "undone"
    tx.set(switch=None)
    tx.record(Kind.PREFETCH, job, detail, seconds=e.seconds, nbytes=e.moved_bytes)
    _serve(tx)


def _side_switch_failed(tx: _Tx, switch: Switch, reason: str, evicted: tuple[str, ...]) -> None:
    """A prefetch or unprefetch that failed (rolled back) or was skipped: nobody waits on
    it, so nothing is retried; the waiter is served by a plain switch when its turn comes."""
    _park(tx, evicted)
    s = tx.s
    changes: dict[str, Any] = {"switch": None}
    if switch.purpose == SwitchKind.UNPREFETCH:
        changes["prefetched"] = tuple(j for j in s.prefetched if j != switch.incoming)
    elif s.holder is not None:
        changes["unfit"] = (s.holder, switch.incoming)
    tx.set(**changes)
    tx.record(Kind.PREFETCH, switch.incoming, reason)
    _serve(tx)


def _prefetch_skipped(tx: _Tx, e: ev.PrefetchSkipped) -> None:
    switch = _current_switch(tx.s, e.epoch)
    if switch is None:
        return
    _record_moves(tx, e.moves)
    _side_switch_failed(tx, switch, f"skipped: {e.reason}", ())


def _snapshot_failed(tx: _Tx, e: ev.SnapshotFailed | ev.SwitchFailed) -> None:
    switch = _current_switch(tx.s, e.epoch)
    if switch is None:
        return
    if switch.purpose != SwitchKind.GRANT:
        _side_switch_failed(tx, switch, f"failed: {e.reason}", ())
        return
    tx.set(switch=None)
    unsure = e.unsure if isinstance(e, ev.SnapshotFailed) else ()
    _maybe_parked(tx, unsure)
    tx.record(Kind.SWITCH_FAILED, switch.incoming, e.reason)
    if switch.attempt < MAX_SWITCH_ATTEMPTS and switch.incoming in tx.s.jobs:
        _retry(tx, switch)
        return
    _fail_switch(tx, switch, e.kind, f"switch to job {switch.incoming!r} failed: {e.reason}")
    if switch.preempted not in unsure:  # a victim that may be parked must not hold again
        _undo_preempt(tx, switch)
    _serve(tx)


def _maybe_parked(tx: _Tx, jobs: tuple[str, ...]) -> None:
    """Count `jobs` parked: a cut-off node may have parked them. A grant of a job counted
    resident moves nothing, so a job frozen there would hold the lock frozen."""
    s = tx.s
    moved = [j for j in jobs if j in s.resident and j != s.holder]
    if moved:
        _place_parked(tx, moved)


def _restore_failed(tx: _Tx, e: ev.RestoreFailed) -> None:
    switch = _current_switch(tx.s, e.epoch)
    if switch is None:
        return
    if switch.purpose != SwitchKind.GRANT:
        _note_parts(tx, e.parts)
        _side_switch_failed(tx, switch, f"failed: {e.reason}", e.evicted)
        return
    _note_parts(tx, e.parts)
    _park(tx, e.evicted)
    _fenced(tx, switch)
    tx.set(switch=None)
    tx.record(Kind.SWITCH_FAILED, switch.incoming, e.reason, nbytes=e.moved_bytes)
    if switch.attempt < MAX_SWITCH_ATTEMPTS and switch.incoming in tx.s.jobs:
        # The evictions that held stay; an overlapped switch undone on every node evicted
        # nothing, so its jobs may be evicted again.
        gone = set(e.evicted)
        _retry(
            tx,
            switch,
            evict=tuple(j for j in switch.evict if j not in gone),
            candidates=tuple(j for j in switch.candidates if j not in gone),
            fence=(),
            restore=True,
            preempted=switch.preempted if switch.preempted not in gone else None,
        )
        return
    s = tx.s
    if switch.incoming in s.jobs:
        tx.set(placement=s.placement.fault(switch.incoming, e.reason))
        tx.record(Kind.FAULTED, switch.incoming, e.reason)
    reason = f"restore of job {switch.incoming!r} failed: {e.reason}; the job is FAULTED"
    _fail_switch(tx, switch, FailedPreconditionError, reason)
    _serve(tx)


def _fenced(tx: _Tx, switch: Switch) -> None:
    """The switch's snapshots held on every node: its lapsed holders are fenced. Their
    state is released now (kept by the agents while their processes live)."""
    s = tx.s
    done = [j for j in switch.fence if j in s.fencing]
    if not done:
        return
    tx.set(fencing=tuple(j for j in s.fencing if j not in done))
    for job in done:
        tx.record(Kind.LEASE_EXPIRED, job, "fenced on every node of the group")
        if job not in s.jobs:  # not registered again meanwhile
            tx.emit(a.ReleaseState(job, force=False))


def _fail_switch(tx: _Tx, switch: Switch, kind: type[RlsliceError], reason: str) -> None:
    if switch.ticket is not None:
        tx.emit(a.Fail(switch.incoming, switch.ticket, kind, reason))
        tx.record(Kind.FAILED, switch.incoming, reason)
