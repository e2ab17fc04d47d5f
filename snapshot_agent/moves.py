"""Running moves: one snapshot or restore, or the halves of a switch, through a backend.

The engine decides (`state.admit`), locks the jobs and commits the job table; this module
runs the backend calls, undoes the halves of a switch that went through when another
failed, and says what each job's record becomes. It keeps no state of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
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
    """One admitted move of a job, alone (Snapshot, Restore) or in a Switch, under way.

    It holds the job's record as admitted; `settled` says what the record becomes."""

    move: Move
    before: state.AgentJobRecord
    epoch: int
    name: str
    backend: Backend
    handle: JobHandle
    outcome: MoveOutcome | None = None
    error: Exception | None = None
    undone: bool = False

    @property
    def job(self) -> str:
        return self.before.job

    @property
    def begun(self) -> state.AgentJobRecord:
        """The record while the move runs (on disk before the backend acts)."""
        return state.begin(self.before, self.move, self.epoch, self.name)


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
    # Inline: two small files per cgroup level, cheaper than a hop to the thread pool.
    cgroups = memguard.cgroup_headrooms(handle.pids)
    reason = memguard.refusal(
        handle.job, nbytes, host_available=host_available, reserve=reserve, cgroups=cgroups
    )
    if reason is not None:
        raise ResourceExhaustedError(f"{reason}; job {handle.job} keeps running")


# -- one move --------------------------------------------------------------------------


def backend_deadline(deadline: float) -> float:
    """The agent's deadline (the loop's clock) as backends take it (`time.time()` clock)."""
    return time.time() + (deadline - asyncio.get_running_loop().time())


async def run(backend: Backend, move: Move, handle: JobHandle, deadline: float) -> MoveOutcome:
    """The backend's snapshot or restore of `handle`, by `deadline` (the loop's clock)."""
    until = backend_deadline(deadline)
    if move is Move.SNAPSHOT:
        return await backend.snapshot(handle, deadline=until)
    return await backend.restore(handle, deadline=until)


def move_span(
    move: Move, handle: JobHandle, epoch: int, node: str, backend: str
) -> NoopSpan | OtelSpan:
    """The trace span of one move."""
    kind = SNAPSHOT if move is Move.SNAPSHOT else RESTORE
    return span(kind, group=handle.group, job=handle.job, epoch=epoch, node=node, backend=backend)


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
def traced(halves: list[Half], node: str) -> Iterator[None]:
    """One span per half (they overlap in a switch), each given its bytes and seconds as
    the block ends, and ended with its half's error, if any."""
    opened = [move_span(h.move, h.handle, h.epoch, node, h.name) for h in halves]
    for one in opened:
        one.__enter__()
    try:
        yield
    finally:
        for half, one in reversed(list(zip(halves, opened, strict=True))):
            if half.outcome is not None:
                one.set(seconds=half.outcome.seconds, bytes=half.outcome.bytes)
            error = half.error
            if error is None:
                one.__exit__(None, None, None)
            else:
                one.__exit__(type(error), error, error.__traceback__)


async def run_halves(halves: list[Half], headroom: int, deadline: float) -> bool:
    """Run the moves; fill each half's outcome or error and undo the others on a failure.
    A lone half is one plain move. True when the restore overlapped the snapshots."""
    backend = halves[0].backend
    if len(halves) > 1 and len({h.name for h in halves}) == 1 and isinstance(backend, SupportsSwap):
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
            deadline=backend_deadline(deadline),
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


def settled(half: Half, seconds: float) -> state.AgentJobRecord:
    """The half's record after the moves: as before a refusal of its options (nothing was
    done), FAULTED with the reason after another failure (the backend rolled back), moved
    when it went through (and, another half failing, could not be undone), else (undone,
    or never run) as it was."""
    error = half.error
    if error is not None:
        if isinstance(error, OptionsError):
            return half.before
        reason = str(error) or type(error).__name__
        return state.fail(half.begun, half.move, half.epoch, reason, seconds)
    if half.outcome is not None:
        outcome = half.outcome
        return state.succeed(half.begun, half.move, half.epoch, outcome.bytes, outcome.seconds)
    return half.before


def failed(halves: Sequence[Half]) -> Half | None:
    """The first half that failed, if any."""
    return next((h for h in halves if h.error is not None), None)


def switch_failure(half: Half) -> SwitchFailure:
    """What a Switch's reply says of its failed half (logged here when unexpected)."""
    error = half.error
    reason = str(error) or type(error).__name__
    if not isinstance(error, BackendError):
        log.error("job %s: %s failed unexpectedly: %s", half.job, half.move.value, reason)
    short = isinstance(error, DeviceMemoryError | ResourceExhaustedError)
    return SwitchFailure(half.job, half.move, reason.splitlines()[0], short)


def reply_for(half: Half, record: state.AgentJobRecord) -> MoveReply:
    """The answer for one half, given its settled record."""
    last = record.last
    if last is not None and last.epoch == half.epoch and last.move is half.move:
        return MoveReply(
            record.job, last.state, last.bytes, last.seconds, False, False, half.epoch, half.name
        )
    return MoveReply(record.job, record.state, epoch=half.epoch, backend=half.name)
