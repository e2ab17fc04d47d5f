"""Who gets the lock next: a grant at once, a switch to start (or retry), or a prefetch
or unprefetch beside the holder while the switch slot is free.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlslice.scheduler.core import actions as a
from rlslice.scheduler.core._holds import _place_resident
from rlslice.scheduler.core._tx import _Tx
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.policies import pick_next
from rlslice.scheduler.core.state import GroupState, Switch, SwitchKind, Waiter


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
    # The job is told of the parts discarded while it was parked (it rebuilds them) once;
    # the hold keeps what it told, should the answer be lost (see `_lost_grant`).
    record = s.jobs.get(job)
    discarded = record.discarded if record is not None else ()
    jobs = s.jobs
    if record is not None and (discarded or record.told_discarded):
        jobs = {**s.jobs, job: replace(record, discarded=(), told_discarded=discarded)}
    tx.set(
        jobs=jobs,
        holder=job,
        holder_since=tx.now,
        yield_requested_at=None,
        epoch=epoch,
        prefetched=tuple(j for j in s.prefetched if j != job),
    )
    _place_resident(tx, job)
    tx.emit(
        a.GrantAction(job, ticket, epoch, waited, restored, switch_seconds, moved_bytes, discarded)
    )
    tx.record(Kind.GRANTED, job, phase, seconds=waited)
    _prefetch(tx)
