"""The `sim` backend's overlapped switch, its async side: halves started, joined and undone.

`SimBackend.swap` (from `SwappingMixin`) stops the outgoing jobs, runs every half's copy
(`_simswap`) in its own worker thread at once, and settles all or nothing: a failed half
stops the others and is undone, then SwapError names the half. A switch with a partial
half (an outgoing job moving some parts, or an incoming one parked so) runs its halves one
after the other instead, undone all the same.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rlslice.config import OFFLOAD_TAGS_OPTION
from rlslice.snapshot_agent.backends import _freeze, _simfs, _simswap
from rlslice.snapshot_agent.backends._simcopy import Aborted, Link, Pacer, discard
from rlslice.snapshot_agent.backends.base import (
    BackendError,
    JobHandle,
    MoveOutcome,
    SwapError,
    SwapOutcome,
)

UNDO_SECONDS = 60.0
"""Seconds past the switch's deadline that undoing a partial switch may take."""


class SwappingMixin:
    """`SimBackend`'s swap; the fields and the two lookups below are `SimBackend`'s."""

    node_dir: Path
    devices_table: list[_simfs.SimFsDevice]
    _chunk: int

    def _rates(self, job: JobHandle) -> tuple[Link, float]:
        """The job's link and per-move overhead (`SimBackend._rates`)."""
        raise NotImplementedError

    def _manifest(self, job: str) -> dict[str, object] | None:
        """The job's parked manifest, None when it has none (`SimBackend._manifest`)."""
        raise NotImplementedError

    async def snapshot(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        """`SimBackend.snapshot`."""
        raise NotImplementedError

    async def restore(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        """`SimBackend.restore`."""
        raise NotImplementedError

    async def swap(
        self,
        outgoing: Sequence[JobHandle],
        incoming: JobHandle | None,
        *,
        headroom_bytes: int,
        deadline: float,
    ) -> SwapOutcome:
        """One node's half of an overlapped switch (see `_simswap`): the outgoing jobs'
        copies out and the incoming job's copy in run at once on the duplex link, incoming
        bytes admitted as outgoing bytes free. All or nothing: a failed half stops the
        others, the incoming job's grown memory is given back (it stays parked) and every
        outgoing job gets its bytes back and runs on; then SwapError names the half."""
        partial = any(OFFLOAD_TAGS_OPTION in job.options for job in outgoing)
        if partial or (incoming is not None and self._parked_partly(incoming.job)):
            return await self._one_after_the_other(outgoing, incoming, deadline)
        entries = self._parked_entries(incoming) if incoming is not None else []
        stopped = await _stop_all(outgoing, deadline)
        # Listed once stopped: a running job can still add or grow a buffer.
        buffers = {job.job: _simfs.job_buffers(self.node_dir, job.job) for job in outgoing}
        abort = threading.Event()
        admission = _simswap.Admission(len(outgoing), abort)
        pacers: list[Pacer] = []
        works = self._swap_works(
            outgoing, incoming, buffers, entries, headroom_bytes, admission, pacers, deadline
        )
        results: list[tuple[int, float] | BaseException]
        if _nothing_to_copy(buffers, entries):
            # No byte to copy: each half is a few file operations (its journal and
            # manifest), fewer microseconds than a hop to a worker thread and back costs on
            # a busy node, so they run here, outgoing first (no half waits on another).
            results = [_run_inline(work) for work, _ in works]
        else:
            futures = [asyncio.ensure_future(asyncio.to_thread(work)) for work, _ in works]
            try:
                found = await asyncio.shield(asyncio.gather(*futures, return_exceptions=True))
            except asyncio.CancelledError:
                admission.stop()
                for pacer in pacers:
                    pacer.cancelled.set()
                await asyncio.gather(*futures, return_exceptions=True)
                await self._undo_swap(outgoing, incoming, stopped)
                raise
            results = list(found)
        halves = [(job.job, "snapshot") for job in outgoing]
        if incoming is not None:
            halves.append((incoming.job, "restore"))
        failed = [
            (half, result)
            for half, result in zip(halves, results, strict=True)
            if isinstance(result, BaseException)
        ]
        if failed:
            await self._undo_swap(outgoing, incoming, stopped)
            raise _swap_error(failed)
        if incoming is not None:
            (_simfs.parked_dir(self.node_dir, incoming.job) / _simfs.MANIFEST).unlink()
        await asyncio.sleep(max((overhead for _, overhead in works), default=0.0))
        outcomes = [r for r in results if not isinstance(r, BaseException)]
        if incoming is not None:
            _freeze.resume(incoming.pids)
            discard(_simfs.parked_dir(self.node_dir, incoming.job))
        moves = tuple(MoveOutcome(nbytes, seconds) for nbytes, seconds in outcomes)
        return SwapOutcome(
            outgoing=moves[: len(outgoing)],
            incoming=moves[-1] if incoming is not None else None,
            overlapped=admission.overlapped,
        )

    def _parked_partly(self, job: str) -> bool:
        manifest = self._manifest(job)
        return manifest is not None and "discarded" in manifest

    async def _one_after_the_other(
        self, outgoing: Sequence[JobHandle], incoming: JobHandle | None, deadline: float
    ) -> SwapOutcome:
        """The snapshots, then the restore, as plain moves; a failure restores the outgoing
        jobs already parked (they run on) and raises SwapError naming the half."""
        done: list[MoveOutcome] = []
        for job in outgoing:
            try:
                done.append(await self.snapshot(job, deadline=deadline))
            except BackendError as error:
                await self._restore_all(outgoing[: len(done)], deadline)
                raise SwapError(job.job, "snapshot", error) from error
        came: MoveOutcome | None = None
        if incoming is not None:
            try:
                came = await self.restore(incoming, deadline=deadline)
            except BackendError as error:
                await self._restore_all(outgoing, deadline)
                raise SwapError(incoming.job, "restore", error) from error
        return SwapOutcome(tuple(done), came, overlapped=False)

    async def _restore_all(self, jobs: Sequence[JobHandle], deadline: float) -> None:
        for job in jobs:
            await self.restore(job, deadline=deadline + UNDO_SECONDS)

    def _parked_entries(self, incoming: JobHandle) -> list[dict[str, object]]:
        """The buffers of the incoming job's parked copy (SwapError when it has none)."""
        manifest = self._manifest(incoming.job)
        found = manifest.get("buffers") if manifest is not None else None
        if not isinstance(found, list):
            why = "no parked copy on this node" if manifest is None else "damaged manifest"
            error = BackendError(f"restore of job {incoming.job}: {why}")
            raise SwapError(incoming.job, "restore", error)
        return found

    def _swap_works(
        self,
        outgoing: Sequence[JobHandle],
        incoming: JobHandle | None,
        buffers: Mapping[str, list[_simfs.BufferFile]],
        entries: list[dict[str, object]],
        headroom_bytes: int,
        admission: _simswap.Admission,
        pacers: list[Pacer],
        deadline: float,
    ) -> list[tuple[Callable[[], tuple[int, float]], float]]:
        """Each half's copy (to run in a thread) and its overhead seconds, outgoing first;
        their pacers are added to `pacers`."""
        works: list[tuple[Callable[[], tuple[int, float]], float]] = []
        for job in outgoing:
            link, overhead = self._rates(job)
            pacer = Pacer(link, "out", deadline, admission.abort, self._chunk)
            pacers.append(pacer)
            work = functools.partial(
                _simswap.save_freeing, self.node_dir, job.job, buffers[job.job], pacer, admission
            )
            works.append((_timed(work, admission), overhead))
        if incoming is not None:
            link, overhead = self._rates(incoming)
            pacer = Pacer(link, "in", deadline, admission.abort, self._chunk)
            pacers.append(pacer)
            totals = {d.index: d.total_bytes for d in self.devices_table}
            work = functools.partial(
                _simswap.load_admitted,
                self.node_dir,
                totals,
                incoming.job,
                entries,
                pacer,
                admission,
                headroom_bytes,
            )
            works.append((_timed(work, admission), overhead))
        return works

    async def _undo_swap(
        self,
        outgoing: Sequence[JobHandle],
        incoming: JobHandle | None,
        stopped: Mapping[str, tuple[int, ...]],
    ) -> None:
        if incoming is not None:  # its manifest stands: it stays parked, its memory goes back
            for buffer in _simfs.job_buffers(self.node_dir, incoming.job):
                if buffer.size:
                    os.truncate(buffer.path, 0)
        for job in outgoing:
            pids = stopped.get(job.job, ())
            await asyncio.to_thread(_simswap.undo_snapshot, self.node_dir, job.job, pids)


async def _stop_all(outgoing: Sequence[JobHandle], deadline: float) -> dict[str, tuple[int, ...]]:
    """Stop every outgoing job's processes (job -> the pids stopped); on a timeout resume
    every one stopped so far and raise SwapError naming the job."""
    stopped: dict[str, tuple[int, ...]] = {}
    for job in outgoing:
        try:
            stopped[job.job] = tuple(await _freeze.stop(job.pids, deadline=deadline))
        except TimeoutError as error:
            _freeze.resume(job.pids)
            for pids in stopped.values():
                _freeze.resume(pids)
            failure = BackendError(f"snapshot of job {job.job}: {error}")
            raise SwapError(job.job, "snapshot", failure) from None
    return stopped


def _nothing_to_copy(
    buffers: Mapping[str, list[_simfs.BufferFile]], entries: list[dict[str, object]]
) -> bool:
    """True when no outgoing buffer holds a byte and the incoming parked copy has none."""
    if any(b.size for found in buffers.values() for b in found):
        return False
    try:
        return not any(int(str(entry["size"])) for entry in entries)
    except (KeyError, ValueError):
        return False  # a damaged manifest: the copy reports it, in the usual way


def _run_inline(work: Callable[[], tuple[int, float]]) -> tuple[int, float] | BaseException:
    """`work` run on the caller's thread, its failure returned as `gather` would."""
    try:
        return work()
    except Exception as error:
        return error


def _timed(
    work: Callable[[], int], admission: _simswap.Admission
) -> Callable[[], tuple[int, float]]:
    """`work` returning (its result, its seconds); a failure stops the other halves."""

    def run() -> tuple[int, float]:
        begun = time.perf_counter()
        try:
            return work(), time.perf_counter() - begun
        except BaseException:
            admission.stop()
            raise

    return run


def _swap_error(failed: list[tuple[tuple[str, str], BaseException]]) -> SwapError:
    """The SwapError for the halves that failed: the first that failed on its own (not
    stopped because another did), named as `<move> of job <job>: <cause>`."""
    (job_name, move), cause = next((f for f in failed if not isinstance(f[1], Aborted)), failed[0])
    if isinstance(cause, BackendError):
        reported = type(cause)(f"{move} of job {job_name}: {cause}")
    elif isinstance(cause, OSError | TimeoutError | KeyError | ValueError | Aborted):
        reported = BackendError(f"{move} of job {job_name}: {cause}")
    else:
        raise cause
    return SwapError(job_name, move, reported)
