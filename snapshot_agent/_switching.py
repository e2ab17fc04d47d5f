"""Moves: a Snapshot, a Restore and a Switch all run here, as the halves of one switch.

A single Snapshot or Restore is a switch of one half; a Switch is one node's half of a
group switch, snapshots out and a restore in, all or nothing. Every call goes the same
way: the halves are admitted and planned under the jobs' locks (taken in job-id order),
begun (on disk before a backend acts, so that a restart knows they were under way), run
by `moves` (side by side or one after the other, undone on a failure) and settled, each
job's record as `moves.settled` says. Deadlines are on the loop's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass

from rlslice._errors import FailedPreconditionError, InvalidArgumentError
from rlslice._ids import validate_id
from rlslice.config import OFFLOAD_TAGS_OPTION
from rlslice.snapshot_agent import moves, state
from rlslice.snapshot_agent._engine_core import EngineCore, check_epoch
from rlslice.snapshot_agent.jobs import JobEntry
from rlslice.snapshot_agent.moves import Half, MoveReply, SwitchHalf, SwitchReply
from rlslice.snapshot_agent.processes import families
from rlslice.snapshot_agent.registry import BackendRegistry
from rlslice.snapshot_agent.state import Move


@dataclass(frozen=True)
class _Ran:
    """What one run of halves did on this node."""

    answers: Mapping[str, MoveReply]
    """Job -> its answer, for every half asked (moved or not)."""
    moved: tuple[Half, ...]
    """The halves that were admitted and ran."""
    overlapped: bool
    failed: Half | None
    seconds: float


class SwitchingMixin(EngineCore):
    """The engine's move part: `move` and `switch`, one path."""

    async def move(
        self,
        move: Move,
        job: str,
        group: str,
        epoch: int,
        *,
        backend: str = "",
        options: Mapping[str, str] | None = None,
        discard_tags: Sequence[str] = (),
        timeout: float = 120.0,
    ) -> MoveReply:
        """Snapshot or restore `job` on this node for `epoch` (see `state.admit`): a switch
        of that one half, whose failure raises the error it answers with."""
        validate_id(job, "job")
        validate_id(group, "group")
        check_epoch(epoch)
        BackendRegistry.check_asked(backend)
        tags = tuple(discard_tags) if move is Move.SNAPSHOT else ()
        half = SwitchHalf(job, backend, dict(options or {}), tags)
        ran = await self._shielded(group, epoch, [(half, move)], 0, timeout)
        if ran.failed is not None:
            assert ran.failed.error is not None
            raise moves.move_error(ran.failed.error, move, job) from ran.failed.error
        if ran.moved:
            await self.refresh_metrics()
        return ran.answers[job]

    async def switch(
        self,
        group: str,
        epoch: int,
        outgoing: Sequence[SwitchHalf],
        incoming: SwitchHalf | None,
        *,
        headroom_bytes: int = 0,
        timeout: float = 120.0,
    ) -> SwitchReply:
        """Snapshot `outgoing` and restore `incoming` on this node at once, all or nothing.

        A backend that `SupportsSwap` admits incoming bytes as outgoing bytes leave; other
        backends run both halves side by side when the incoming job fits beside the
        outgoing ones (free device memory minus `headroom_bytes`), one after the other
        otherwise. A failed half undoes the other: outgoing jobs run on, the incoming job
        stays parked, and the reply's `failure` names the half. Refusals (a stale epoch, a
        job in another group, host memory short) raise before anything moves."""
        validate_id(group, "group")
        check_epoch(epoch)
        halves = [*outgoing, *([incoming] if incoming is not None else [])]
        for half in halves:
            validate_id(half.job, "job")
            BackendRegistry.check_asked(half.backend)
        if len({half.job for half in halves}) != len(halves):
            raise InvalidArgumentError("switch: a job appears twice")
        asked = [(h, Move.SNAPSHOT) for h in outgoing]
        if incoming is not None:
            asked.append((incoming, Move.RESTORE))
        ran = await self._shielded(group, epoch, asked, headroom_bytes, timeout)
        if ran.moved:
            self._spawn(self.refresh_metrics())  # off the switch's path
        return SwitchReply(
            outgoing=tuple(ran.answers[o.job] for o in outgoing),
            incoming=ran.answers[incoming.job] if incoming is not None else None,
            seconds=ran.seconds,
            overlapped=ran.overlapped,
            failure=moves.switch_failure(ran.failed) if ran.failed is not None else None,
        )

    async def _shielded(
        self,
        group: str,
        epoch: int,
        asked: list[tuple[SwitchHalf, Move]],
        headroom: int,
        timeout: float,
    ) -> _Ran:
        """Run the halves as a task of its own, shielded from the caller: a caller that
        gives up does not cut a copy in half, and the result is kept for a repeat."""
        deadline = asyncio.get_running_loop().time() + timeout
        task = self._spawn(self._run(group, epoch, asked, headroom, deadline))
        result = await asyncio.shield(task)
        assert isinstance(result, _Ran)
        return result

    async def _run(
        self,
        group: str,
        epoch: int,
        asked: list[tuple[SwitchHalf, Move]],
        headroom: int,
        deadline: float,
    ) -> _Ran:
        started = time.perf_counter()
        if self._processes is not None:
            await self._processes.rediscover()
        entries = {h.job: self.table.entries.get(h.job) for h, _ in asked}
        overlapped = False
        async with self._locked(e for e in entries.values() if e is not None):
            answers, running = await self._plan(asked, entries, group, epoch, deadline)
            if running:
                known = {job: e for job, e in entries.items() if e is not None}
                overlapped = await self._run_halves(running, known, headroom, deadline, started)
                answers.update((h.job, moves.reply_for(h, known[h.job].record)) for h in running)
        failed = moves.failed(running)
        for half in running:
            if failed is None and half.outcome is not None:
                self._count(half.move, half.name, half.outcome.bytes, half.outcome.seconds)
        self._refresh_jobs()
        return _Ran(answers, tuple(running), overlapped, failed, time.perf_counter() - started)

    @contextlib.asynccontextmanager
    async def _locked(self, entries: Iterable[JobEntry]) -> AsyncIterator[None]:
        """Hold the locks of `entries`, taken in the order of their job ids (no deadlock
        between two switches)."""
        async with contextlib.AsyncExitStack() as locks:
            for entry in sorted(entries, key=lambda e: e.record.job):
                await locks.enter_async_context(entry.lock)
            yield

    async def _plan(
        self,
        asked: list[tuple[SwitchHalf, Move]],
        entries: Mapping[str, JobEntry | None],
        group: str,
        epoch: int,
        deadline: float,
    ) -> tuple[dict[str, MoveReply], list[Half]]:
        """The answers of the halves that do not move, and the halves that do."""
        known = [(job, e) for job, e in entries.items() if e is not None]
        # Inline, not in a thread: the walk reads only the jobs' own /proc entries (tens of
        # microseconds), less than a hop to the thread pool costs.
        scanned = families([e.processes for _, e in known])
        pids_of = {job: pids for (job, _), pids in zip(known, scanned, strict=True)}
        answers: dict[str, MoveReply] = {}
        running: list[Half] = []
        for wanted, move in asked:
            entry = entries[wanted.job]
            if entry is None:
                answers[wanted.job] = MoveReply(wanted.job, None, absent=True, epoch=epoch)
                continue
            pids = pids_of[wanted.job]
            found = await self._plan_half(entry, wanted, move, group, epoch, deadline, pids)
            if isinstance(found, MoveReply):
                answers[wanted.job] = found
            else:
                running.append(found)
        return answers, running

    async def _plan_half(
        self,
        entry: JobEntry,
        half: SwitchHalf,
        move: Move,
        group: str,
        epoch: int,
        deadline: float,
        pids: tuple[int, ...],
    ) -> MoveReply | Half:
        record = entry.record
        decision = state.admit(
            record, move, epoch, group=group, node=self.node, has_processes=bool(pids)
        )
        answer = moves.early_answer(decision, record.job, record, epoch)
        if answer is not None:
            return answer
        name = self.backends.for_move(entry, move, half.backend)
        backend = await self.backend(name)
        partial = move is Move.SNAPSHOT and OFFLOAD_TAGS_OPTION in half.options
        if partial and not backend.splits_parts:
            raise FailedPreconditionError(
                f"snapshot of job {record.job}: the {name} backend moves whole "
                "processes, not tagged parts"
            )
        await self._await_workloads(entry, backend, deadline)
        tags = half.discard_tags if move is Move.SNAPSHOT else ()
        handle = self._handle(entry, pids, dict(half.options), tags)
        return Half(move, record, epoch, name, backend, handle)

    async def _run_halves(
        self,
        running: list[Half],
        entries: Mapping[str, JobEntry],
        headroom: int,
        deadline: float,
        started: float,
    ) -> bool:
        """Run the admitted halves: two units of the table, the moves begun and their end
        (written once, however they end). Whether the restore overlapped the snapshots."""
        try:
            for half in running:  # every refusal before anything moves
                if half.move is Move.SNAPSHOT:
                    await self._guard(half.handle, half.backend)
        except Exception:
            for half in running:
                self.tiering.settled(half.job)
            raise
        with self.table.change():
            for half in running:
                entries[half.job].record = half.begun
        self._refresh_jobs()
        with self.table.change():
            with moves.traced(running, self.node):
                overlapped = await moves.run_halves(running, headroom, deadline)
            seconds = time.perf_counter() - started
            for half in running:
                entries[half.job].record = moves.settled(half, seconds)
        return overlapped
