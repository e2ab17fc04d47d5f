"""When the scheduler asks a holder to yield, and why. Pure: the state and the time in.

Three reasons, each read by KeepAlive answers (clients learn of a request at their next
renewal; there is no push channel):

- `max_hold`: the holder held past the group's `max_hold_seconds`; it is preempted after
  `yield_grace_seconds` unless it yields (the machine keeps `yield_requested_at`).
- `preempted`: the job was preempted while it believed it held; its next Yield is accepted.
- `train_waiting` (early yield): the holder runs a phase the group declares `rollout`, and
  the waiter the group's policy would serve next runs a phase declared `train`. The holder
  is asked to end its rollout at its next safe point (a step boundary); nothing preempts it,
  and a `train` holder is never asked. Off when the spec sets `early_yield: false`; phase
  names the spec does not declare are never part of it.
"""

from __future__ import annotations

import enum
import math

from rlslice.config import PhaseKind
from rlslice.scheduler.core.policies import pick_next
from rlslice.scheduler.core.state import GroupState, Waiter


class YieldReason(enum.StrEnum):
    """Why a holder is asked to yield ("" when it is not)."""

    NONE = ""
    MAX_HOLD = "max_hold"
    PREEMPTED = "preempted"
    TRAIN_WAITING = "train_waiting"


def early_yield_for(state: GroupState, now: float) -> Waiter | None:
    """The `train` waiter the holder's `rollout` should make way for now, or None."""
    spec = state.spec
    if not spec.early_yield or not spec.phases or state.holder is None:
        return None
    if state.switch is not None:
        return None  # a switch in flight decides the next holder already
    record = state.jobs.get(state.holder)
    if record is None or spec.phase_kind(record.phase) is not PhaseKind.ROLLOUT:
        return None
    waiter = pick_next(state, now)
    if waiter is None or spec.phase_kind(waiter.phase) is not PhaseKind.TRAIN:
        return None
    return waiter


def yield_reason(state: GroupState, job: str, now: float) -> YieldReason:
    """Why `job` is asked to yield `state`'s group now (`NONE`: it is not)."""
    if state.holder == job and state.yield_requested_at is not None:
        return YieldReason.MAX_HOLD
    if job in state.preempted:
        return YieldReason.PREEMPTED
    if state.holder == job and early_yield_for(state, now) is not None:
        return YieldReason.TRAIN_WAITING
    return YieldReason.NONE


def keepalive_answer(state: GroupState, job: str, now: float) -> tuple[float, bool, float]:
    """(ttl seconds, yield requested, seconds before preemption) for a KeepAlive of `job`.

    An early yield (`train_waiting`) is never followed by a preemption: its seconds are
    infinite."""
    record = state.jobs[job]
    ttl = max(0.0, record.expires_at - now)
    reason = yield_reason(state, job, now)
    if reason is YieldReason.MAX_HOLD:
        assert state.yield_requested_at is not None
        left = state.yield_requested_at + state.spec.yield_grace_seconds - now
        return ttl, True, max(0.0, left)
    if reason is YieldReason.PREEMPTED:
        return ttl, True, 0.0
    if reason is YieldReason.TRAIN_WAITING:
        return ttl, True, math.inf
    return ttl, False, 0.0
