"""Lock bookkeeping of the state machine: where jobs are placed, a hold's end, a job's
removal from the group, and the checks on a named job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from rlslice._errors import FailedPreconditionError, UnavailableError
from rlslice.config import GroupSpec
from rlslice.scheduler.core import actions as a
from rlslice.scheduler.core import events as ev
from rlslice.scheduler.core._tx import _Tx
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.state import GroupState, JobRecord


def _park(tx: _Tx, evicted: tuple[str, ...]) -> None:
    s = tx.s
    gone = {j for j in evicted if j in s.jobs}
    if gone:
        _place_parked(tx, [j for j in evicted if j in gone])
        tx.set(prefetched=tuple(j for j in s.prefetched if j not in gone))


def _place_resident(tx: _Tx, job: str) -> None:
    """`job` is on the GPUs now, the most recently used (it leaves any other place)."""
    s = tx.s
    record = s.jobs.get(job)
    if record is not None and record.parked_parts:
        tx.set(jobs={**s.jobs, job: replace(record, parked_parts=())})
    tx.set(placement=tx.s.placement.with_resident(job))


def _note_parts(tx: _Tx, parts: Mapping[str, ev.PartsParked]) -> None:
    """Remember what partial snapshots did with the parked jobs' parts: the tags discarded
    (added to those the job has not been told of yet) and the tags parked in host memory
    (none listed when some node parked the job whole)."""
    s = tx.s
    changed = {}
    for job, moved in parts.items():
        record = s.jobs.get(job)
        if record is None:
            continue
        changed[job] = replace(
            record,
            discarded=tuple(dict.fromkeys((*record.discarded, *moved.discarded))),
            parked_parts=() if moved.whole else moved.offloaded,
        )
    if changed:
        tx.set(jobs={**s.jobs, **changed})


def _place_parked(tx: _Tx, jobs: list[str]) -> None:
    """`jobs` are in host DRAM now, after those parked before (leaving any other place)."""
    tx.set(placement=tx.s.placement.park(jobs))


def _end_hold(tx: _Tx) -> float:
    """Close the current hold; return its length. What its grant told of the discarded
    parts is forgotten: the job had the answer (see `_lost_grant` for one it did not)."""
    s = tx.s
    assert s.holder is not None
    held = max(0.0, tx.now - s.holder_since)
    record = s.jobs[s.holder]
    ended = replace(
        record,
        held_seconds=record.held_seconds + held,
        last_served_at=tx.now,
        told_discarded=(),
    )
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
