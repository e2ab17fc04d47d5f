"""Running moves: one snapshot or restore, or the halves of a switch, through a backend.

The engine decides (`state.admit`), locks the jobs and commits the job table; this module
runs the backend calls, undoes the halves of a switch that went through when another
failed, and says what each job's record becomes. It keeps no state of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from rlslice._errors import (
    AbortedError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    ResourceExhaustedError,
    RlsliceError,
)
from rlslice.adapters.tracing import RESTORE, SNAPSHOT, NoopSpan, OtelSpan, span
from rlslice.snapshot_agent import memguard, state
from rlslice.snapshot_agent.backends.base import (
    Backend,
    BackendError,
    DeviceMemoryError,
    JobHandle,
    MoveOutcome,
    OptionsError,
    SupportsSwap,
    SwapError,
)
from rlslice.snapshot_agent.jobs import JobEntry
from rlslice.snapshot_agent.state import JobState, Move

log = logging.getLogger(__name__)

#: Extra seconds past the switch's deadline that undoing a half that went through may take.
UNDO_GRACE_SECONDS = 60.0


@dataclass(frozen=True)
class MoveReply:
    """The answer to a Snapshot or Restore on this node."""

    job: str
    state: JobState | None
    bytes: int = 0
    seconds: float = 0.0
    repeated: bool = False
    absent: bool = False
    epoch: int = 0
    backend: str = ""


@dataclass(frozen=True)
class SwitchHalf:
    """One job of a Switch call."""

    job: str
    backend: str = ""
    options: Mapping[str, str] = field(default_factory=dict)
    discard_tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class SwitchFailure:
    """Which half of a Switch failed on this node (both were undone)."""

    job: str
    move: Move
    reason: str
    resource_exhausted: bool = False


@dataclass(frozen=True)
class SwitchReply:
    """The answer to a Switch on this node."""

    outgoing: tuple[MoveReply, ...]
    incoming: MoveReply | None
    seconds: float
    overlapped: bool = False
    failure: SwitchFailure | None = None


@dataclass
class Half:
    """One move of a Switch under way."""

    move: Move
    entry: JobEntry
    before: state.AgentJobRecord
    released: bool
    name: str
    backend: Backend
    handle: JobHandle
    outcome: MoveOutcome | None = None
    error: Exception | None = None
    undone: bool = False


# -- before a move ---------------------------------------------------------------------


def early_answer(
    decision: state.Decision, job: str, record: state.AgentJobRecord | None, epoch: int
) -> MoveReply | None:
    """The reply to a move that does not go ahead (absent or repeated); None to go ahead.
    A refusal raises FailedPreconditionError with its message."""
    if isinstance(decision, state.Absent):
        return MoveReply(job, record.state if record else None, absent=True, epoch=epoch)
    if isinstance(decision, state.Repeat):
        r = decision.result
        return MoveReply(job, r.state, r.bytes, r.seconds, True, False, r.epoch, r.backend)
    if isinstance(decision, state.Refuse):
        raise FailedPreconditionError(decision.message)
    return None


async def guard(handle: JobHandle, backend: Backend, *, host_available: int, reserve: int) -> None:
    """Refuse (RESOURCE_EXHAUSTED) a snapshot whose bytes host memory cannot take."""
    nbytes = await backend.device_bytes(handle)
    # Staging the job keeps already is not asked for twice.
    nbytes = max(0, nbytes - await backend.held_host_bytes(handle))
    cgroups = await asyncio.to_thread(memguard.cgroup_headrooms, handle.pids)
    reason = memguard.refusal(
        handle.job, nbytes, host_available=host_available, reserve=reserve, cgroups=cgroups
    )
    if reason is not None:
        raise ResourceExhaustedError(f"{reason}; job {handle.job} keeps running")


# -- one move --------------------------------------------------------------------------


async def run(backend: Backend, move: Move, handle: JobHandle, deadline: float) -> MoveOutcome:
    """The backend's snapshot or restore of `handle`."""
    if move is Move.SNAPSHOT:
        return await backend.snapshot(handle, deadline=deadline)
    return await backend.restore(handle, deadline=deadline)


def move_span(
    move: Move, handle: JobHandle, epoch: int, node: str, backend: str
) -> NoopSpan | OtelSpan:
    """The trace span of one move."""
    kind = SNAPSHOT if move is Move.SNAPSHOT else RESTORE
    return span(kind, group=handle.group, job=handle.job, epoch=epoch, node=node, backend=backend)


def after_failure(
    error: Exception,
    before: tuple[state.AgentJobRecord, bool],
    current: state.AgentJobRecord,
    move: Move,
    epoch: int,
    seconds: float,
) -> tuple[state.AgentJobRecord, bool]:
    """A failed move's job record and released flag: as before a refusal of its options
    (nothing was done), else FAULTED with the reason (the backend rolled back)."""
    if isinstance(error, OptionsError):
        return before
    reason = str(error) or type(error).__name__
    return state.fail(current, move, epoch, reason, seconds), False


def move_error(error: Exception, move: Move, job: str) -> RlsliceError:
    """The error a failed move answers with (logged here, once)."""
    reason = str(error) or type(error).__name__
    if isinstance(error, OptionsError):
        return InvalidArgumentError(f"options: {reason}")
    if isinstance(error, DeviceMemoryError):
        log.warning("job %s: %s refused: %s", job, move.value, error)
        return ResourceExhaustedError(reason)
    if not isinstance(error, BackendError):
        log.error("job %s: %s failed unexpectedly", job, move.value, exc_info=error)
        return InternalError(f"{move.value} of job {job} failed: {reason}")
    log.warning("job %s: %s failed: %s", job, move.value, error)
    where = (
        "rolled back, the job keeps running" if move is Move.SNAPSHOT else "the job stays parked"
    )
    return AbortedError(f"{move.value} of job {job} failed ({where}): {reason}")


# -- the halves of a switch ------------------------------------------------------------


@contextlib.contextmanager
def traced(halves: list[Half], epoch: int, node: str) -> Iterator[None]:
    """One span per half, as the serial path traces them (they overlap here), each given
    its bytes and seconds as the block ends."""
    opened = [move_span(h.move, h.handle, epoch, node, h.name) for h in halves]
    with contextlib.ExitStack() as spans:
        for one in opened:
            spans.enter_context(one)
        yield
        for half, one in zip(halves, opened, strict=True):
            if half.outcome is not None:
                one.set(seconds=half.outcome.seconds, bytes=half.outcome.bytes)


async def run_halves(halves: list[Half], headroom: int, deadline: float) -> bool:
    """Run the moves; fill each half's outcome or error and undo the others on a failure.
    True when the restore overlapped the snapshots."""
    backend = halves[0].backend
    if len({h.name for h in halves}) == 1 and isinstance(backend, SupportsSwap):
        return await _swap(backend, halves, headroom, deadline)
    outs = [h for h in halves if h.move is Move.SNAPSHOT]
    into = next((h for h in halves if h.move is Move.RESTORE), None)
    side_by_side = into is None or not outs or await fits(into, headroom)
    if side_by_side:
        await asyncio.gather(*(_run_half(h, deadline) for h in halves))
    else:
        await asyncio.gather(*(_run_half(h, deadline) for h in outs))
        if into is not None and not any(h.error for h in outs):
            await _run_half(into, deadline)
    if any(h.error for h in halves):
        await _undo(halves, deadline + UNDO_GRACE_SECONDS)
    return side_by_side and into is not None and bool(outs)


async def _swap(backend: SupportsSwap, halves: list[Half], headroom: int, deadline: float) -> bool:
    outs = [h for h in halves if h.move is Move.SNAPSHOT]
    into = next((h for h in halves if h.move is Move.RESTORE), None)
    try:
        done = await backend.swap(
            [h.handle for h in outs],
            into.handle if into is not None else None,
            headroom_bytes=headroom,
            deadline=deadline,
        )
    except SwapError as error:
        for half in halves:
            if half.handle.job == error.job:
                half.error = error.cause
            else:
                half.undone = True
        return False
    except Exception as error:  # a bug: the backend undid what it could
        log.exception("switch: the %s backend failed unexpectedly", halves[0].backend.name)
        for half in halves:
            half.error = error
        return False
    for half, outcome in zip(outs, done.outgoing, strict=True):
        half.outcome = outcome
    if into is not None:
        into.outcome = done.incoming
    return done.overlapped


async def _run_half(half: Half, deadline: float) -> None:
    try:
        half.outcome = await run(half.backend, half.move, half.handle, deadline)
    except Exception as error:
        half.error = error


async def _undo(halves: list[Half], deadline: float) -> None:
    """Move back the halves that went through (a snapshot is restored, and so on)."""
    for half in halves:
        if half.outcome is None:
            continue
        back = Move.RESTORE if half.move is Move.SNAPSHOT else Move.SNAPSHOT
        try:
            await run(half.backend, back, half.handle, deadline)
            half.undone, half.outcome = True, None
        except Exception as error:
            log.error("job %s: undoing its %s failed: %s", half.handle.job, half.move.value, error)


async def fits(into: Half, headroom: int) -> bool:
    """Whether the incoming job's parked bytes fit in free device memory now."""
    devices = await into.backend.devices()
    frees = [d.total_bytes - d.used_bytes for d in devices]
    free = len(frees) * min(frees) if frees else 0
    return into.before.parked_bytes + headroom <= free


def settle_halves(halves: list[Half], epoch: int, seconds: float) -> SwitchFailure | None:
    """Each half's record after the moves; the failure, if any."""
    failed = next((h for h in halves if h.error is not None), None)
    for half in halves:
        entry = half.entry
        if half.error is not None:
            before = (half.before, half.released)
            entry.record, entry.released = after_failure(
                half.error, before, entry.record, half.move, epoch, seconds
            )
        elif half.outcome is not None:
            # It worked, or (another half failed) it went through and could not be undone.
            entry.record = state.succeed(
                entry.record, half.move, epoch, half.outcome.bytes, half.outcome.seconds
            )
        else:  # undone, or never run: as it was
            entry.record, entry.released = half.before, half.released
    if failed is None:
        return None
    error = failed.error
    reason = str(error) or type(error).__name__
    if not isinstance(error, BackendError):
        log.error(
            "job %s: %s failed unexpectedly: %s", failed.handle.job, failed.move.value, reason
        )
    short = isinstance(error, DeviceMemoryError | ResourceExhaustedError)
    return SwitchFailure(failed.handle.job, failed.move, reason.splitlines()[0], short)


def reply_for(half: Half, epoch: int) -> MoveReply:
    """The answer for one half once settled."""
    record = half.entry.record
    last = record.last
    if last is not None and last.epoch == epoch and last.move is half.move:
        return MoveReply(
            record.job, last.state, last.bytes, last.seconds, False, False, epoch, half.name
        )
    return MoveReply(record.job, record.state, epoch=epoch, backend=half.name)
