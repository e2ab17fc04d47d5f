"""The lock → checkpoint / restore → unlock sequence shared by the `cuda` and `cuda-checkpoint`
backends, with rollback. Each backend supplies `ProcessOps`: the five per-process operations
(through the driver API in a thread, or by exec'ing NVIDIA's binary).

Snapshot, for every CUDA process of the job on this node, all processes at once per step:
  get-state → lock (driver-side timeout) → checkpoint.
  A lock failure unlocks what was locked; a checkpoint failure restores and unlocks what
  was checkpointed and unlocks what was only locked; a process whose own step failed is
  asked for its state and put back accordingly. Then BackendError: the job keeps running.
Restore: get-state → restore the CHECKPOINTED → unlock. A restore failure checkpoints again
  what this call restored, so the job stays consistently parked for a retry.
Both are idempotent over process states, so a retry after a partial failure, or after an
agent restart, continues from where the processes really are.

Bytes come from NVML per-process memory before the snapshot (checkpointed processes vanish
from NVML), kept in the backend's state directory for the restore.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Protocol

from pydantic import BaseModel, ConfigDict, Field

from rlslice.snapshot_agent.backends import _options
from rlslice.snapshot_agent.backends._nvml import Nvml, NvmlUnavailable, known_total
from rlslice.snapshot_agent.backends.base import (
    BackendBase,
    BackendError,
    BackendState,
    DeviceUsage,
    JobHandle,
    MoveOutcome,
)

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_MS = 10_000
DEFAULT_ROLLBACK_SECONDS = 60.0
# How long a rollback goes on in the background after the caller stopped waiting for it.
BACKGROUND_ROLLBACK_SECONDS = 600.0


class ProcState(enum.StrEnum):
    """A process's checkpoint state, as the driver reports it."""

    RUNNING = "running"
    LOCKED = "locked"
    CHECKPOINTED = "checkpointed"
    FAILED = "failed"
    CHECKPOINTING = "checkpointing"
    RESTORING = "restoring"


class StepError(Exception):
    """One operation on one process failed."""

    def __init__(self, op: str, pid: int, reason: str) -> None:
        super().__init__(f"{op} pid {pid}: {reason}")
        self.op = op
        self.pid = pid
        self.reason = reason


class NotCudaProcess(StepError):
    """The driver does not know the process as a CUDA process (a data loader, a shell)."""


class ProcessOps(Protocol):
    """The per-process operations a checkpoint backend provides. Each honours `deadline`
    (time.time() clock) and raises StepError (TimeoutError past the deadline)."""

    async def get_state(self, pid: int, *, deadline: float) -> ProcState: ...

    async def lock(self, pid: int, *, timeout_ms: int, deadline: float) -> None: ...

    async def checkpoint(self, pid: int, *, deadline: float) -> None: ...

    async def restore(self, pid: int, *, deadline: float) -> None: ...

    async def unlock(self, pid: int, *, deadline: float) -> None: ...


class CheckpointOptions(BaseModel):
    """What `cuda` and `cuda-checkpoint` moves read, agent level or per group (a group's
    value wins)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    lock_timeout_ms: Annotated[float, Field(gt=0)] = DEFAULT_LOCK_TIMEOUT_MS
    """How long a process's lock may take, ms (within the move's deadline)."""
    rollback_seconds: Annotated[float, Field(gt=0)] = DEFAULT_ROLLBACK_SECONDS
    """How long a failed move waits for its rollback before it goes on in the background."""


def _move_options(job: JobHandle, defaults: dict[str, str]) -> CheckpointOptions:
    """The agent's options under the job's; a malformed one is a BackendError naming it."""
    return _options.parse(CheckpointOptions, {**defaults, **job.options}, error=BackendError)


def summarize(states: Iterable[ProcState]) -> BackendState:
    """One state for a job from its processes' states."""
    seen = set(states)
    if not seen:
        return BackendState.UNKNOWN
    if ProcState.FAILED in seen:
        return BackendState.FAILED
    if seen == {ProcState.RUNNING}:
        return BackendState.RUNNING
    if seen == {ProcState.CHECKPOINTED}:
        return BackendState.PARKED
    return BackendState.UNKNOWN  # mid-operation, or split


class CheckpointMover:
    """Runs snapshots and restores over `ProcessOps`; one instance per backend object."""

    def __init__(
        self,
        ops: ProcessOps,
        nvml: Nvml | None,
        *,
        state_dir: Path,
        backend: str,
        options: dict[str, str],
    ) -> None:
        self._ops = ops
        self._nvml = nvml
        self._state_dir = state_dir
        self._backend = backend
        self._options = options
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._background: set[asyncio.Task[None]] = set()

    def _job_lock(self, job: JobHandle) -> asyncio.Lock:
        return self._locks.setdefault((job.group, job.job), asyncio.Lock())

    # --- bytes, kept across agent restarts -------------------------------------------

    def _bytes_file(self, job: JobHandle) -> Path:
        return self._state_dir / f"{self._backend}.{job.group}.{job.job}.json"

    def _save_bytes(self, job: JobHandle, nbytes: int) -> None:
        path = self._bytes_file(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"bytes": nbytes, "pids": list(job.pids)}))
        os.replace(tmp, path)

    def _load_bytes(self, job: JobHandle) -> int | None:
        try:
            return int(json.loads(self._bytes_file(job).read_text())["bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def forget(self, job: JobHandle) -> None:
        """Drop what is kept for the job (its recorded byte count)."""
        self._bytes_file(job).unlink(missing_ok=True)

    async def _process_bytes(self, pids: Iterable[int]) -> dict[int, int | None]:
        if self._nvml is None:
            return {}
        try:
            return await self._nvml.aprocess_bytes(pids)
        except NvmlUnavailable as error:
            log.warning("%s: cannot measure device bytes: %s", self._backend, error)
            return {}

    async def _used_bytes(self) -> int | None:
        if self._nvml is None:
            return None
        try:
            return await self._nvml.aused_bytes()
        except NvmlUnavailable:
            return None

    async def device_bytes(self, job: JobHandle) -> int:
        return known_total(await self._process_bytes(job.pids)) or 0

    # --- states -----------------------------------------------------------------------

    async def _states(self, pids: Iterable[int], deadline: float) -> dict[int, ProcState]:
        """States of the job's CUDA processes; processes the driver does not know are left out."""
        pids = tuple(pids)
        results = await asyncio.gather(
            *(self._ops.get_state(pid, deadline=deadline) for pid in pids), return_exceptions=True
        )
        states: dict[int, ProcState] = {}
        for pid, result in zip(pids, results, strict=True):
            if isinstance(result, NotCudaProcess):
                log.debug("%s: %s", self._backend, result)
            elif isinstance(result, BaseException):
                raise BackendError(f"{self._backend}: get-state: {_reason(result)}")
            else:
                states[pid] = result
        return states

    async def state(self, job: JobHandle) -> BackendState:
        try:
            states = await self._states(job.pids, time.time() + 10.0)
        except BackendError as error:
            log.warning("%s: state of job %s: %s", self._backend, job.job, error)
            return BackendState.UNKNOWN
        return summarize(states.values())

    # --- the steps --------------------------------------------------------------------

    async def _each(
        self, op: Callable[[int], Awaitable[None]], pids: Iterable[int]
    ) -> tuple[list[int], dict[int, BaseException]]:
        """Run `op` on every pid at once; (pids that succeeded, pid -> failure)."""
        pids = list(pids)
        results = await asyncio.gather(*(op(pid) for pid in pids), return_exceptions=True)
        done = [pid for pid, r in zip(pids, results, strict=True) if r is None]
        failed = {
            pid: r for pid, r in zip(pids, results, strict=True) if isinstance(r, BaseException)
        }
        return done, failed

    async def snapshot(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        async with self._job_lock(job):
            return await self._snapshot(job, deadline)

    def _refuse_unmovable(
        self, states: dict[int, ProcState], per_pid: dict[int, int | None]
    ) -> None:
        """BackendError before anything moves: memory the API cannot move, or bad states."""
        unknown = [pid for pid, used in per_pid.items() if pid not in states and used]
        if unknown:
            raise BackendError(
                f"{self._backend}: pids {unknown} use GPU memory (NVML) but the checkpoint "
                "API does not know them as CUDA processes"
            )
        if failed := [pid for pid, s in states.items() if s is ProcState.FAILED]:
            raise BackendError(f"{self._backend}: pids {failed} are in the FAILED state")
        if busy := [
            pid for pid, s in states.items() if s in (ProcState.CHECKPOINTING, ProcState.RESTORING)
        ]:
            raise BackendError(f"{self._backend}: pids {busy} are mid-operation; retry")

    async def _snapshot(self, job: JobHandle, deadline: float) -> MoveOutcome:
        start = time.monotonic()
        states = await self._states(job.pids, deadline)
        per_pid = await self._process_bytes(job.pids)
        self._refuse_unmovable(states, per_pid)
        running = [pid for pid, s in states.items() if s is ProcState.RUNNING]
        locked = [pid for pid, s in states.items() if s is ProcState.LOCKED]
        done = [pid for pid, s in states.items() if s is ProcState.CHECKPOINTED]
        if not running and not locked:
            # Nothing resident: a repeat of a finished snapshot, or no CUDA process at all.
            return MoveOutcome(bytes=(self._load_bytes(job) or 0) if done else 0, seconds=0.0)

        moving = [pid for pid in states if pid not in done]
        nbytes = known_total({pid: per_pid.get(pid) for pid in moving})
        used_before = await self._used_bytes() if nbytes is None else None
        await self._lock_and_checkpoint(job, running, locked, deadline)
        if nbytes is None and used_before is not None:
            used_after = await self._used_bytes()
            nbytes = max(0, used_before - (used_after or used_before))
        total = (nbytes or 0) + ((self._load_bytes(job) or 0) if done else 0)
        self._save_bytes(job, total)
        return MoveOutcome(bytes=total, seconds=time.monotonic() - start)

    async def _lock_and_checkpoint(
        self, job: JobHandle, running: list[int], locked: list[int], deadline: float
    ) -> None:
        """Lock the running, then checkpoint every locked process; on a failure, roll back
        and raise BackendError (the job keeps running)."""
        lock_ms = int(_move_options(job, self._options).lock_timeout_ms)
        remaining_ms = int((deadline - time.time()) * 1000)
        if remaining_ms <= 0:
            raise BackendError(f"{self._backend}: deadline passed before locking")
        timeout_ms = max(1, min(lock_ms, remaining_ms))

        async def lock(pid: int) -> None:
            await self._ops.lock(pid, timeout_ms=timeout_ms, deadline=deadline)

        async def checkpoint(pid: int) -> None:
            await self._ops.checkpoint(pid, deadline=deadline)

        newly_locked, lock_failed = await self._each(lock, running)
        if lock_failed:
            done_words = await self._roll_back(
                job, locked=[*locked, *newly_locked], doubtful=lock_failed
            )
            raise BackendError(f"{self._backend}: lock failed: {_first(lock_failed)}; {done_words}")
        to_checkpoint = [*locked, *newly_locked]
        checkpointed, ckpt_failed = await self._each(checkpoint, to_checkpoint)
        if ckpt_failed:
            done_words = await self._roll_back(
                job,
                checkpointed=checkpointed,
                locked=[
                    pid
                    for pid in to_checkpoint
                    if pid not in checkpointed and pid not in ckpt_failed
                ],
                doubtful=ckpt_failed,
            )
            raise BackendError(
                f"{self._backend}: checkpoint failed: {_first(ckpt_failed)}; {done_words}"
            )

    async def _roll_back(
        self,
        job: JobHandle,
        *,
        checkpointed: Iterable[int] = (),
        locked: Iterable[int] = (),
        doubtful: dict[int, BaseException] | None = None,
    ) -> str:
        """Put every process back to RUNNING. The caller waits up to the `rollback_seconds`
        option; past that the rollback goes on in the background. Returns words for the
        caller's message."""
        seconds = _move_options(job, self._options).rollback_seconds
        task = asyncio.ensure_future(
            self._put_back(
                list(checkpointed),
                list(locked),
                dict(doubtful or {}),
                max(seconds, BACKGROUND_ROLLBACK_SECONDS),
            )
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            await asyncio.wait_for(asyncio.shield(task), seconds)
        except TimeoutError:
            log.error("%s: rollback of job %s continues in the background", self._backend, job.job)
            return "rollback continues in the background"
        return "rolled back"

    async def _put_back(
        self,
        checkpointed: list[int],
        locked: list[int],
        doubtful: dict[int, BaseException],
        seconds: float,
    ) -> None:
        deadline = time.time() + seconds
        # A process whose own step failed (or ran past the deadline) is asked where it is.
        for pid in doubtful:
            try:
                state = await self._ops.get_state(pid, deadline=deadline)
            except Exception as error:
                log.error("%s: rollback: state of pid %s: %s", self._backend, pid, _reason(error))
                continue
            if state is ProcState.CHECKPOINTED:
                checkpointed.append(pid)
            elif state is ProcState.LOCKED:
                locked.append(pid)
            elif state is not ProcState.RUNNING:
                log.error("%s: rollback: pid %s left %s", self._backend, pid, state.value)

        async def restore(pid: int) -> None:
            await self._ops.restore(pid, deadline=deadline)

        async def unlock(pid: int) -> None:
            await self._ops.unlock(pid, deadline=deadline)

        restored, failed = await self._each(restore, checkpointed)
        _, unlock_failed = await self._each(unlock, [*restored, *locked])
        for failure in [*failed.values(), *unlock_failed.values()]:
            log.error("%s: rollback: %s", self._backend, _reason(failure))

    async def restore(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        async with self._job_lock(job):
            return await self._restore(job, deadline)

    async def _restore(self, job: JobHandle, deadline: float) -> MoveOutcome:
        start = time.monotonic()
        states = await self._states(job.pids, deadline)
        if failed := [pid for pid, s in states.items() if s is ProcState.FAILED]:
            raise BackendError(f"{self._backend}: pids {failed} are in the FAILED state")
        parked = [pid for pid, s in states.items() if s is ProcState.CHECKPOINTED]
        locked = [pid for pid, s in states.items() if s is ProcState.LOCKED]
        if not parked and not locked:
            return MoveOutcome(bytes=0, seconds=0.0)  # already running: a repeat

        async def restore(pid: int) -> None:
            await self._ops.restore(pid, deadline=deadline)

        async def unlock(pid: int) -> None:
            await self._ops.unlock(pid, deadline=deadline)

        async def checkpoint(pid: int) -> None:
            await self._ops.checkpoint(pid, deadline=time.time() + DEFAULT_ROLLBACK_SECONDS)

        restored, restore_failed = await self._each(restore, parked)
        if restore_failed:
            # Keep the job consistently parked: what came back goes out again.
            _, again_failed = await self._each(checkpoint, restored)
            for error in again_failed.values():
                log.error("%s: re-checkpoint after failed restore: %s", self._backend, error)
            raise BackendError(
                f"{self._backend}: restore failed: {_first(restore_failed)}; job stays parked"
            )
        _, unlock_failed = await self._each(unlock, [*locked, *restored])
        if unlock_failed:
            raise BackendError(f"{self._backend}: unlock failed: {_first(unlock_failed)}")
        nbytes = self._load_bytes(job) if parked else 0
        if nbytes is None:  # nothing recorded (state dir lost): measure what came back
            nbytes = known_total(await self._process_bytes(parked)) or 0
        return MoveOutcome(bytes=nbytes, seconds=time.monotonic() - start)


class MoverBackend(BackendBase):
    """What `cuda` and `cuda-checkpoint` share: every move goes through a `CheckpointMover`,
    device memory comes from NVML. Subclasses build the mover (`_get_mover`) and probe."""

    _nvml: Nvml

    def _get_mover(self) -> CheckpointMover:
        raise NotImplementedError

    async def device_bytes(self, job: JobHandle) -> int:
        return await self._get_mover().device_bytes(job)

    async def snapshot(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        return await self._get_mover().snapshot(job, deadline=deadline)

    async def restore(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        return await self._get_mover().restore(job, deadline=deadline)

    async def state(self, job: JobHandle) -> BackendState:
        return await self._get_mover().state(job)

    async def release(self, job: JobHandle) -> int:
        # The parked copy lives in the job's own process (the driver keeps it there) and is
        # freed with it; nothing of it sits in the agent.
        self._get_mover().forget(job)
        return 0

    async def devices(self) -> Sequence[DeviceUsage]:
        try:
            return await self._nvml.adevices()
        except NvmlUnavailable:
            return []


def _reason(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return f"deadline passed ({error})" if str(error) else "deadline passed"
    return str(error) or type(error).__name__


def _first(failures: dict[int, BaseException]) -> str:
    pid, error = next(iter(failures.items()))
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    text = _reason(error)
    return (text if str(pid) in text else f"pid {pid}: {text}") + more
