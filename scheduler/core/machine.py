"""The group state machine: `step(state, event, now) -> Transition`. Pure: no I/O, no clock.

A refused event raises an `rlslice` error and the caller keeps the old state, so a refusal
never changes anything. Accepted events return the new state and the actions to execute,
in order. Epochs only rise: an immediate grant raises the epoch by one; a switch reserves
two (one for its snapshots and restore, one for rollback restores) and its grant keeps them.

This module dispatches each event to its handler and handles the group's own events; the
rest lives beside it by reason to change: `_requests` (requests from jobs), `_timers`
(leases, max hold, `deadline`), `_dispatch` (who is served next: grants, switches,
prefetches), `_outcomes` (the coordinator's reports), `_holds` (lock bookkeeping and
placement) and `_tx` (the transition under way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rlslice._errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from rlslice.config import GroupSpec
from rlslice.scheduler.core import actions as a
from rlslice.scheduler.core import events as ev
from rlslice.scheduler.core._dispatch import _serve
from rlslice.scheduler.core._holds import _end_hold
from rlslice.scheduler.core._outcomes import (
    MAX_SWITCH_ATTEMPTS,
    _prefetch_skipped,
    _restore_failed,
    _snapshot_failed,
    _switch_done,
)
from rlslice.scheduler.core._requests import (
    _acquire,
    _cancel,
    _keepalive,
    _lost_grant,
    _register,
    _unregister,
    _yield,
)
from rlslice.scheduler.core._timers import _check_hold, _tick, deadline
from rlslice.scheduler.core._tx import _Tx
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.spec_change import spec_change_refusal
from rlslice.scheduler.core.state import GroupState
from rlslice.scheduler.core.yields import keepalive_answer


@dataclass(frozen=True, slots=True)
class Transition:
    """The state after an event (None: the group was deleted) and the actions to execute."""

    state: GroupState | None
    actions: tuple[a.Action, ...]


def new_group(spec: GroupSpec) -> GroupState:
    """A group with no jobs."""
    return GroupState(spec=spec)


def step(state: GroupState, event: ev.Event, now: float) -> Transition:
    """Apply `event` at time `now`. Raises an `RlsliceError` (state unchanged) to refuse it."""
    tx = _Tx(state, now)
    _HANDLERS[type(event)](tx, event)
    return Transition(None if tx.deleted else tx.s, tuple(tx.actions))


def _put_group(tx: _Tx, e: ev.PutGroup) -> None:
    if e.spec.name != tx.s.name:
        raise InvalidArgumentError(f"spec.name: {e.spec.name!r} is not group {tx.s.name!r}")
    refusal = spec_change_refusal(tx.s.spec, e.spec, tx.s)
    if refusal is not None:
        raise FailedPreconditionError(refusal)
    jobs = dict(tx.s.jobs)
    for listed in e.spec.jobs:  # the admin's priority and weight win over Register's
        record = jobs.get(listed.name)
        if record is not None:
            jobs[listed.name] = replace(record, priority=listed.priority, weight=listed.weight)
    tx.set(spec=e.spec, jobs=jobs)
    tx.record(Kind.GROUP_PUT)
    _check_hold(tx)
    _serve(tx)


def _delete_group(tx: _Tx, e: ev.DeleteGroup) -> None:
    s = tx.s
    busy = s.holder or (s.switch.incoming if s.switch else None)
    if busy and not e.force:
        raise FailedPreconditionError(
            f"group: {s.name!r} is held by {busy!r}; set force to delete it anyway"
        )
    reason = f"group {s.name!r} was deleted"
    for waiter in s.queue:
        if waiter.attached:
            tx.emit(a.Fail(waiter.job, waiter.ticket, NotFoundError, reason))
    if s.switch is not None and s.switch.ticket is not None:
        tx.emit(a.Fail(s.switch.incoming, s.switch.ticket, NotFoundError, reason))
    if s.holder is not None:
        _end_hold(tx)
    for job in s.jobs:
        tx.emit(a.ReleaseState(job, force=True))
    tx.record(Kind.GROUP_DELETED)
    tx.deleted = True


def _recover(tx: _Tx, e: ev.Recover) -> None:
    s = tx.s
    # Callers reconnect after a restart: give every lease a fresh term to do so.
    jobs = {
        name: replace(r, expires_at=max(r.expires_at, tx.now + r.lease_seconds))
        for name, r in s.jobs.items()
    }
    queue = tuple(replace(w, attached=False) for w in s.queue)
    switch = None
    if s.switch is not None:
        # The job being switched in was chosen before the restart: it keeps its turn.
        detached = s.switch.detached or s.switch.ticket is not None
        switch = replace(s.switch, ticket=None, detached=detached)
    tx.set(jobs=jobs, queue=queue, switch=switch)
    if switch is not None:
        tx.emit(a.StartSwitch(switch, resume=True))


_HANDLERS: dict[type[Any], Callable[[_Tx, Any], None]] = {
    ev.Register: _register,
    ev.Unregister: _unregister,
    ev.KeepAlive: _keepalive,
    ev.Acquire: _acquire,
    ev.Cancel: _cancel,
    ev.Yield: _yield,
    ev.LostGrant: _lost_grant,
    ev.Tick: _tick,
    ev.SwitchDone: _switch_done,
    ev.SnapshotFailed: _snapshot_failed,
    ev.SwitchFailed: _snapshot_failed,
    ev.RestoreFailed: _restore_failed,
    ev.PrefetchSkipped: _prefetch_skipped,
    ev.PutGroup: _put_group,
    ev.DeleteGroup: _delete_group,
    ev.Recover: _recover,
}


__all__ = ["MAX_SWITCH_ATTEMPTS", "Transition", "deadline", "keepalive_answer", "new_group", "step"]
