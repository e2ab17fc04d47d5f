"""Time in the state machine: lease lapses, the max-hold ask and preemption after the
grace period, and `deadline`, the next time a Tick would change something.
"""

from __future__ import annotations

from rlslice.scheduler.core import actions as a
from rlslice.scheduler.core import events as ev
from rlslice.scheduler.core._dispatch import _serve, _start_switch
from rlslice.scheduler.core._holds import _end_hold, _remove
from rlslice.scheduler.core._tx import _Tx
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.policies import pick_next
from rlslice.scheduler.core.state import GroupState

_FENCE_REASON = "lease lapsed while holding: fenced on every node before the next grant"


def _tick(tx: _Tx, e: ev.Tick) -> None:
    for record in list(tx.s.jobs.values()):
        if record.expires_at <= tx.now:
            if tx.s.holder == record.name:
                # Alive but unreachable, maybe: fenced on every node before the next grant.
                _remove(tx, record.name, Kind.LEASE_EXPIRED, _FENCE_REASON, force=False, fence=True)
            else:
                _remove(tx, record.name, Kind.LEASE_EXPIRED, "lease lapsed", force=False)
    _check_hold(tx)
    _serve(tx)


def _check_hold(tx: _Tx) -> None:
    """Ask a holder past max_hold_seconds to yield; preempt it after the grace period."""
    s = tx.s
    limit = s.spec.max_hold_seconds
    if s.holder is None or limit <= 0 or s.switch is not None or not s.attached_waiters():
        return
    if s.yield_requested_at is None:
        if tx.now >= s.holder_since + limit:
            # The request lives in the state (KeepAlive answers read it: clients poll, there
            # is no push channel) and in the YIELD_REQUESTED event; nothing else to execute.
            tx.set(yield_requested_at=tx.now)
            tx.record(Kind.YIELD_REQUESTED, s.holder, f"held past {limit:g} s")
        return
    if tx.now < s.yield_requested_at + s.spec.yield_grace_seconds:
        return
    victim, since = s.holder, s.holder_since
    waiter = pick_next(s, tx.now)
    assert waiter is not None  # attached_waiters() > 0
    held = _end_hold(tx)
    tx.set(
        preempted=tx.s.preempted | {victim}, queue=tuple(w for w in tx.s.queue if w is not waiter)
    )
    tx.emit(a.Preempt(victim))
    tx.record(
        Kind.PREEMPTED, victim, f"did not yield within {s.spec.yield_grace_seconds:g} s", held
    )
    _start_switch(tx, waiter, evict=(victim,), preempted=victim, preempted_since=since)


def deadline(state: GroupState) -> float | None:
    """The next time a Tick would change something: a lease lapse or a max-hold step."""
    times = [record.expires_at for record in state.jobs.values()]
    limit = state.spec.max_hold_seconds
    holding = state.holder is not None and state.switch is None
    if holding and limit > 0 and state.attached_waiters():
        if state.yield_requested_at is None:
            times.append(state.holder_since + limit)
        else:
            times.append(state.yield_requested_at + state.spec.yield_grace_seconds)
    return min(times) if times else None
