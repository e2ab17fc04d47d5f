"""The group state machine: `step(state, event, now) -> Transition`. Pure: no I/O, no clock.

A refused event raises an `rlslice` error and the caller keeps the old state, so a refusal
never changes anything. Accepted events return the new state and the actions to execute,
in order. Epochs only rise: an immediate grant raises the epoch by one; a switch reserves
two (one for its snapshots and restore, one for rollback restores) and its grant keeps them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

from rlslice._errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    RlsliceError,
    UnavailableError,
)
from rlslice.config import GroupSpec
from rlslice.scheduler.core import actions as a
from rlslice.scheduler.core import events as ev
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.policies import pick_next
from rlslice.scheduler.core.spec_change import spec_change_refusal
from rlslice.scheduler.core.state import (
    GroupState,
    JobRecord,
    Switch,
    SwitchKind,
    Waiter,
)
from rlslice.scheduler.core.yields import keepalive_answer

#: A switch that fails is tried this many times in all before its waiter fails.
MAX_SWITCH_ATTEMPTS = 2
_FENCE_REASON = "lease lapsed while holding: fenced on every node before the next grant"


@dataclass(frozen=True, slots=True)
class Transition:
    """The state after an event (None: the group was deleted) and the actions to execute."""

    state: GroupState | None
    actions: tuple[a.Action, ...]


def new_group(spec: GroupSpec) -> GroupState:
    """A group with no jobs."""
    return GroupState(spec=spec)


_STATE_FIELDS = GroupState.__slots__
# `_evolve` skips `__init__`: it would also have to call this if GroupState ever had one.
assert not hasattr(GroupState, "__post_init__")
_STATE_FIELD_SET = frozenset(_STATE_FIELDS)
_state_values = attrgetter(*_STATE_FIELDS)
_new = object.__new__
_setattr = object.__setattr__


_VIEWS = frozenset(("resident", "parked", "faulted"))


def _evolve(state: GroupState, changes: dict[str, Any]) -> GroupState:
    """`dataclasses.replace(state, **changes)`, about three times faster: every transition
    makes a few of these. GroupState has no `__post_init__` and every field is an init
    field, so filling the slots directly builds the same value `replace` would. The
    placement views (`resident`, `parked`, `faulted`) are taken as `GroupState` takes them."""
    if not _VIEWS.isdisjoint(changes):
        changes = dict(changes)
        views = {name: changes.pop(name) for name in _VIEWS & changes.keys()}
        changes["placement"] = changes.get("placement", state.placement).with_views(**views)
    unknown = changes.keys() - _STATE_FIELD_SET
    if unknown:
        raise TypeError(f"GroupState has no field {sorted(unknown)[0]!r}")
    new = _new(GroupState)
    for name, value in zip(_STATE_FIELDS, _state_values(state), strict=True):
        _setattr(new, name, changes.get(name, value))
    return new


class _Tx:
    """Accumulates one transition: the evolving state and the actions, in order."""

    __slots__ = ("actions", "deleted", "now", "s")

    def __init__(self, state: GroupState, now: float) -> None:
        self.s = state
        self.now = now
        self.actions: list[a.Action] = []
        self.deleted = False

    def set(self, **changes: Any) -> None:
        self.s = _evolve(self.s, changes)

    def emit(self, action: a.Action) -> None:
        self.actions.append(action)

    def record(
        self, kind: Kind, job: str = "", detail: str = "", seconds: float = 0.0, nbytes: int = 0
    ) -> None:
        self.actions.append(a.Record(kind, job, detail, seconds, nbytes))


def step(state: GroupState, event: ev.Event, now: float) -> Transition:
    """Apply `event` at time `now`. Raises an `RlsliceError` (state unchanged) to refuse it."""
    tx = _Tx(state, now)
    _HANDLERS[type(event)](tx, event)
    return Transition(None if tx.deleted else tx.s, tuple(tx.actions))


# -- requests from jobs ---------------------------------------------------------------


def _register(tx: _Tx, e: ev.Register) -> None:
    s = tx.s
    if e.job in s.jobs:
        raise AlreadyExistsError(
            f"job: {e.job!r} already has a live lease in group {s.name!r}; "
            "unregister it or let it lapse"
        )
    # A job the admin listed in the spec takes the spec's priority and weight (the admin's
    # word wins); Register's values count only for a job the spec does not list.
    listed = _listed(s.spec, e.job)
    known = s.spec.job(e.job)
    record = JobRecord(
        name=e.job,
        lease_id=e.lease_id,
        secret_hash=e.secret_hash,
        lease_seconds=e.lease_seconds,
        expires_at=tx.now + e.lease_seconds,
        priority=known.priority if listed or e.priority is None else e.priority,
        weight=known.weight if listed or e.weight is None else e.weight,
        device_bytes=e.device_bytes,
        session=e.session,
    )
    tx.set(jobs={**s.jobs, e.job: record})
    tx.record(Kind.REGISTERED, e.job)


def _unregister(tx: _Tx, e: ev.Unregister) -> None:
    _require_job(tx.s, e.job)
    _remove(tx, e.job, Kind.UNREGISTERED, "unregistered", force=True)
    _serve(tx)


def _keepalive(tx: _Tx, e: ev.KeepAlive) -> None:
    record = _require_job(tx.s, e.job)
    renewed = replace(record, expires_at=tx.now + record.lease_seconds)
    tx.set(jobs={**tx.s.jobs, e.job: renewed})


def _acquire(tx: _Tx, e: ev.Acquire) -> None:
    s = tx.s
    _require_job(s, e.job)
    if s.holder == e.job:
        # An answer, not a refusal: the client re-issuing an acquire whose answer it lost
        # now knows it holds, so a late LostGrant for this hold must not undo that.
        tx.set(acknowledged=(e.job, s.epoch))
        reason = f"job: {e.job!r} already holds group {s.name!r}"
        tx.emit(a.Fail(e.job, e.ticket, AlreadyExistsError, reason))
        return
    waiter = s.waiter(e.job)
    if waiter is not None:
        if waiter.attached:
            raise AlreadyExistsError(f"job: {e.job!r} is already waiting for group {s.name!r}")
        # A caller back after a scheduler restart takes its old place in the queue.
        rejoined = replace(waiter, ticket=e.ticket, attached=True, phase=e.phase or waiter.phase)
        _note_phase(tx, e.job, rejoined.phase)
        tx.set(queue=tuple(rejoined if w is waiter else w for w in tx.s.queue))
        tx.record(Kind.QUEUED, e.job, "rejoined")
        _serve(tx)
        return
    if s.switch is not None and s.switch.incoming == e.job and s.switch.purpose == SwitchKind.GRANT:
        if s.switch.ticket is not None:
            raise AlreadyExistsError(f"job: {e.job!r} is already waiting for group {s.name!r}")
        tx.set(switch=replace(s.switch, ticket=e.ticket, detached=False))
        tx.record(Kind.QUEUED, e.job, "rejoined during a switch")
        return
    if e.job in s.preempted:
        tx.set(preempted=s.preempted - {e.job})  # acquiring again implies the yield
    _note_phase(tx, e.job, e.phase)
    tx.set(queue=(*tx.s.queue, Waiter(e.job, e.ticket, tx.now, e.phase)))
    tx.record(Kind.QUEUED, e.job, e.phase)
    _check_hold(tx)
    _serve(tx)


def _note_phase(tx: _Tx, job: str, phase: str) -> None:
    """Keep on the job's record the phase it waits for (it holds that phase once granted)."""
    record = tx.s.jobs[job]
    if record.phase != phase:
        tx.set(jobs={**tx.s.jobs, job: replace(record, phase=phase)})


def _cancel(tx: _Tx, e: ev.Cancel) -> None:
    s = tx.s
    for waiter in s.queue:
        if waiter.job == e.job and waiter.ticket == e.ticket:
            tx.set(queue=tuple(w for w in s.queue if w is not waiter))
            tx.record(Kind.CANCELLED, e.job)
            _prefetch(tx)
            return
    if s.switch is not None and s.switch.incoming == e.job and s.switch.ticket == e.ticket:
        # The switch runs on (it cannot stop half-way); the job ends up resident, not holding.
        tx.set(switch=replace(s.switch, ticket=None))
        tx.record(Kind.CANCELLED, e.job, "during its switch")


def _yield(tx: _Tx, e: ev.Yield) -> None:
    s = tx.s
    _require_job(s, e.job)
    waiters = s.attached_waiters()
    if s.holder == e.job:
        held = _end_hold(tx)
        tx.record(Kind.YIELDED, e.job, seconds=held)
        tx.emit(a.Yielded(e.job, waiters, snapshot_deferred=waiters == 0))
        _serve(tx)
        return
    if e.job in s.preempted:
        tx.set(preempted=s.preempted - {e.job})
        tx.record(Kind.YIELDED, e.job, "after preemption")
        tx.emit(a.Yielded(e.job, waiters, snapshot_deferred=False))
        return
    holder = f"held by {s.holder!r}" if s.holder else "not held"
    raise FailedPreconditionError(
        f"job: {e.job!r} does not hold group {s.name!r} (it is {holder}); only the holder may yield"
    )


def _lost_grant(tx: _Tx, e: ev.LostGrant) -> None:
    s = tx.s
    if s.acknowledged == (e.job, e.epoch):
        return  # the job called again and was told it holds: it does
    if s.holder == e.job and s.epoch == e.epoch:
        _yield(tx, ev.Yield(e.job))


# -- time -------------------------------------------------------------------------------


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


# -- switches ---------------------------------------------------------------------------


def _serve(tx: _Tx) -> None:
    """Hand a free group to the next waiter: at once if it is resident, else by a switch."""
    s = tx.s
    if s.switch is not None:
        return
    waiter = pick_next(s, tx.now) if s.holder is None else None
    if waiter is None:
        _prefetch(tx)
        return
    tx.set(queue=tuple(w for w in s.queue if w is not waiter))
    if waiter.job in s.fencing:
        # The lapsed holder came back under its name and is served first: nobody else was
        # granted meanwhile, and it is the job the fence was for.
        tx.set(fencing=tuple(j for j in s.fencing if j != waiter.job))
    if waiter.job in s.resident and not tx.s.fencing:
        _grant(tx, waiter.job, waiter.ticket, tx.now - waiter.since, phase=waiter.phase)
    else:
        _start_switch(tx, waiter)


def _prefetch(tx: _Tx) -> None:
    """With the switch slot free: park again a prefetched job that stopped waiting, else
    restore the head waiter beside the holder ahead of its grant (the coordinator plans it
    and skips it when it does not fit; the same holder and waiter are not tried twice).
    Never while a lapsed holder waits to be fenced."""
    s = tx.s
    if s.switch is not None or s.fencing:
        return
    stale = next((j for j in s.prefetched if j != s.holder and s.waiter(j) is None), None)
    if stale is not None:
        _launch(tx, _side_switch(s, stale, SwitchKind.UNPREFETCH, tx.now, evict=(stale,)))
        return
    if s.holder is None:
        return
    waiter = pick_next(s, tx.now)
    if waiter is None or not waiter.attached or waiter.job not in s.parked:
        return
    if waiter.job in s.faulted or s.unfit == (s.holder, waiter.job):
        return
    candidates = tuple(j for j in s.resident if j not in (s.holder, waiter.job))
    switch = _side_switch(s, waiter.job, SwitchKind.PREFETCH, waiter.since, candidates=candidates)
    _launch(tx, replace(switch, phase=waiter.phase, started_at=tx.now))


def _side_switch(
    s: GroupState,
    job: str,
    purpose: SwitchKind,
    since: float,
    *,
    evict: tuple[str, ...] = (),
    candidates: tuple[str, ...] = (),
) -> Switch:
    """A prefetch or an unprefetch: moves beside the holder, never a grant."""
    return Switch(
        incoming=job,
        ticket=None,
        waited_since=since,
        evict=evict,
        candidates=candidates,
        restore=purpose == SwitchKind.PREFETCH,
        epoch=s.epoch + 1,
        rollback_epoch=s.epoch + 2,
        attempt=1,
        started_at=since,
        purpose=purpose,
    )


def _start_switch(
    tx: _Tx,
    waiter: Waiter,
    *,
    evict: tuple[str, ...] = (),
    preempted: str | None = None,
    preempted_since: float = 0.0,
) -> None:
    s = tx.s
    fence = tuple(j for j in s.fencing if j != waiter.job)
    switch = Switch(
        incoming=waiter.job,
        ticket=waiter.ticket,
        waited_since=waiter.since,
        evict=(*evict, *(j for j in fence if j not in evict)),
        fence=fence,
        # Resident jobs, least recently used first; then parked ones, which a switch cut
        # off mid-call may have left on the devices (evicting one parked indeed moves nothing).
        candidates=tuple(j for j in (*s.resident, *s.parked) if j != waiter.job and j not in evict),
        restore=waiter.job in s.parked or waiter.job in s.faulted,
        epoch=s.epoch + 1,
        rollback_epoch=s.epoch + 2,
        attempt=1,
        started_at=tx.now,
        preempted=preempted,
        preempted_since=preempted_since,
        phase=waiter.phase,
    )
    _launch(tx, switch)


def _launch(tx: _Tx, switch: Switch) -> None:
    tx.set(switch=switch, epoch=max(tx.s.epoch, switch.rollback_epoch))
    tx.emit(a.StartSwitch(switch))
    if switch.purpose != SwitchKind.GRANT:
        detail = "started" if switch.purpose == SwitchKind.PREFETCH else "undoing"
        tx.record(Kind.PREFETCH, switch.incoming, detail)
        return
    detail = f"attempt {switch.attempt}"
    if switch.evict:
        detail += f"; evict {', '.join(switch.evict)}"
    tx.record(Kind.SWITCH_STARTED, switch.incoming, detail)


def _retry(tx: _Tx, switch: Switch, **changes: Any) -> None:
    epoch = tx.s.epoch
    _launch(
        tx,
        replace(
            switch,
            epoch=epoch + 1,
            rollback_epoch=epoch + 2,
            attempt=switch.attempt + 1,
            started_at=tx.now,
            **changes,
        ),
    )


def _current_switch(s: GroupState, epoch: int) -> Switch | None:
    """The switch a coordinator report is about, or None for a stale report."""
    return s.switch if s.switch is not None and s.switch.epoch == epoch else None


def _switch_done(tx: _Tx, e: ev.SwitchDone) -> None:
    s = tx.s
    switch = _current_switch(s, e.epoch)
    if switch is None:
        return
    _record_moves(tx, e)
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


def _record_moves(tx: _Tx, e: ev.SwitchDone) -> None:
    """One ring event per node and move (the node in `detail`): the timeline's moves lane."""
    for move in e.moves:
        kind = Kind.RESTORE_DONE if move.restore else Kind.SNAPSHOT_DONE
        tx.record(kind, move.job, move.node, seconds=move.seconds, nbytes=move.bytes)


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
        _side_switch_failed(tx, switch, f"failed: {e.reason}", e.evicted)
        return
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
        tx.set(placement=s.placement.with_views(faulted={**s.faulted, switch.incoming: e.reason}))
        tx.record(Kind.FAULTED, switch.incoming, e.reason)
    reason = f"restore of job {switch.incoming!r} failed: {e.reason}; the job is FAULTED"
    _fail_switch(tx, switch, FailedPreconditionError, reason)
    _serve(tx)


def _park(tx: _Tx, evicted: tuple[str, ...]) -> None:
    s = tx.s
    gone = {j for j in evicted if j in s.jobs}
    if gone:
        _place_parked(tx, [j for j in evicted if j in gone])
        tx.set(prefetched=tuple(j for j in s.prefetched if j not in gone))


def _place_resident(tx: _Tx, job: str) -> None:
    """`job` is on the GPUs now, the most recently used (it leaves any other place)."""
    s = tx.s
    resident = (*(j for j in s.resident if j != job), job)
    tx.set(placement=s.placement.with_views(resident=resident))


def _place_parked(tx: _Tx, jobs: list[str]) -> None:
    """`jobs` are in host DRAM now, after those parked before (leaving any other place)."""
    s = tx.s
    parked = s.parked
    tx.set(
        placement=s.placement.with_views(parked=(*parked, *(j for j in jobs if j not in parked)))
    )


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


def _undo_preempt(tx: _Tx, switch: Switch) -> None:
    """A failed preemption leaves the victim running: it holds again, and the grace restarts."""
    victim = switch.preempted
    s = tx.s
    if victim is None or victim not in s.preempted or victim not in s.jobs or s.holder:
        return
    tx.set(
        holder=victim,
        holder_since=tx.now,
        yield_requested_at=tx.now,
        preempted=s.preempted - {victim},
    )


# -- lock bookkeeping -------------------------------------------------------------------


def _grant(
    tx: _Tx,
    job: str,
    ticket: int | None,
    waited: float,
    *,
    restored: bool = False,
    switch_seconds: float = 0.0,
    moved_bytes: int = 0,
    reserved: bool = False,
    phase: str = "",
) -> None:
    s = tx.s
    epoch = s.epoch if reserved else s.epoch + 1
    # A prefetched job's bytes came back ahead of its grant: nothing moves now.
    restored = restored or job in s.prefetched
    tx.set(
        holder=job,
        holder_since=tx.now,
        yield_requested_at=None,
        epoch=epoch,
        prefetched=tuple(j for j in s.prefetched if j != job),
    )
    _place_resident(tx, job)
    tx.emit(a.Grant(job, ticket, epoch, waited, restored, switch_seconds, moved_bytes))
    tx.record(Kind.GRANTED, job, phase, seconds=waited)
    _prefetch(tx)


def _end_hold(tx: _Tx) -> float:
    """Close the current hold; return its length."""
    s = tx.s
    assert s.holder is not None
    held = max(0.0, tx.now - s.holder_since)
    record = s.jobs[s.holder]
    ended = replace(record, held_seconds=record.held_seconds + held, last_served_at=tx.now)
    tx.set(
        jobs={**s.jobs, s.holder: ended},
        holder=None,
        holder_since=0.0,
        yield_requested_at=None,
        acknowledged=None,
    )
    tx.emit(a.HoldEnded(record.name, held))
    return held


def _remove(
    tx: _Tx, job: str, kind: Kind, reason: str, *, force: bool, fence: bool = False
) -> None:
    """Take `job` out of the group entirely; its waiting call fails with UNAVAILABLE.

    `fence`: its state is released only once a switch has fenced it (see `_fenced`)."""
    if tx.s.holder == job:
        _end_hold(tx)
    s = tx.s
    failure = f"job {job!r} in group {s.name!r}: {reason}"
    waiter = s.waiter(job)
    if waiter is not None:
        tx.set(queue=tuple(w for w in s.queue if w is not waiter))
        if waiter.attached:
            tx.emit(a.Fail(job, waiter.ticket, UnavailableError, failure))
    if s.switch is not None and s.switch.incoming == job and s.switch.ticket is not None:
        tx.emit(a.Fail(job, s.switch.ticket, UnavailableError, failure))
        tx.set(switch=replace(s.switch, ticket=None))
    switch = tx.s.switch
    if switch is not None and (job in switch.evict or job in switch.candidates):
        # Later attempts (a retry, a resume after a restart) must not move a job that left;
        # the attempt under way ends first (the engine releases the job's state after it).
        tx.set(
            switch=replace(
                switch,
                evict=tuple(j for j in switch.evict if j != job),
                candidates=tuple(j for j in switch.candidates if j != job),
            )
        )
    s = tx.s
    fencing = tuple(j for j in s.fencing if j != job)
    tx.set(
        jobs={name: r for name, r in s.jobs.items() if name != job},
        placement=s.placement.without(job),
        preempted=s.preempted - {job},
        fencing=(*fencing, job) if fence else fencing,
        prefetched=tuple(j for j in s.prefetched if j != job),
    )
    tx.record(kind, job, reason)
    if not fence:
        tx.emit(a.ReleaseState(job, force))


def _listed(spec: GroupSpec, job: str) -> bool:
    return any(listed.name == job for listed in spec.jobs)


def _require_job(s: GroupState, job: str) -> JobRecord:
    record = s.jobs.get(job)
    if record is None:
        raise FailedPreconditionError(f"job: {job!r} is not registered in group {s.name!r}")
    return record


# -- the group itself -------------------------------------------------------------------


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
