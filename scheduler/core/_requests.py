"""Requests from jobs: register, unregister, keep-alive, acquire, cancel, yield, and a
grant whose caller went away (LostGrant).
"""

from __future__ import annotations

from dataclasses import replace

from rlslice._errors import AlreadyExistsError, FailedPreconditionError
from rlslice.scheduler.core import actions as a
from rlslice.scheduler.core import events as ev
from rlslice.scheduler.core._dispatch import _prefetch, _serve
from rlslice.scheduler.core._holds import _end_hold, _listed, _remove, _require_job
from rlslice.scheduler.core._timers import _check_hold
from rlslice.scheduler.core._tx import _Tx
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.state import JobRecord, SwitchKind, Waiter


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
        lock_only=e.lock_only,
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
        # The job never read the grant: the discarded tags it told are told again next time.
        record = s.jobs[e.job]
        if record.told_discarded:
            retold = tuple(dict.fromkeys((*record.told_discarded, *record.discarded)))
            tx.set(jobs={**s.jobs, e.job: replace(record, discarded=retold, told_discarded=())})
        _yield(tx, ev.Yield(e.job))
