"""Switches: one node's half of a group switch, snapshots out and a restore in, all or nothing.

The halves are admitted and planned here under the jobs' locks (taken in job-id order);
`moves` runs them side by side or one after the other and settles their records.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence

from rlslice._errors import InvalidArgumentError
from rlslice._ids import validate_id
from rlslice.snapshot_agent import moves, state
from rlslice.snapshot_agent._engine_core import EngineCore, check_epoch
from rlslice.snapshot_agent.jobs import JobEntry
from rlslice.snapshot_agent.moves import Half, MoveReply, SwitchFailure, SwitchHalf, SwitchReply
from rlslice.snapshot_agent.processes import families
from rlslice.snapshot_agent.registry import BackendRegistry
from rlslice.snapshot_agent.state import Move


class SwitchingMixin(EngineCore):
    """The engine's switch part: `switch` and the planning and running of its halves."""

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
        deadline = time.time() + timeout
        task = self._spawn(
            self._switch(group, epoch, tuple(outgoing), incoming, headroom_bytes, deadline)
        )
        result = await asyncio.shield(task)
        assert isinstance(result, SwitchReply)
        return result

    async def _switch(
        self,
        group: str,
        epoch: int,
        outgoing: tuple[SwitchHalf, ...],
        incoming: SwitchHalf | None,
        headroom: int,
        deadline: float,
    ) -> SwitchReply:
        started = time.perf_counter()
        if self._processes is not None:
            await self._processes.rediscover()
        asked = [(h, Move.SNAPSHOT) for h in outgoing]
        if incoming is not None:
            asked.append((incoming, Move.RESTORE))
        entries = {h.job: self.table.entries.get(h.job) for h, _ in asked}
        overlapped, failure = False, None
        async with self._locked(e for e in entries.values() if e is not None):
            answers, running = await self._plan(asked, entries, group, epoch, deadline)
            if running:
                overlapped, failure = await self._run_switch(
                    running, epoch, headroom, deadline, started
                )
                answers.update((h.entry.record.job, moves.reply_for(h, epoch)) for h in running)
        for half in running:
            if failure is None and half.outcome is not None:
                self._count(half.move, half.name, half.outcome.bytes, half.outcome.seconds)
        self._refresh_jobs()
        if running:
            self._spawn(self.refresh_metrics())  # off the switch's path
        return SwitchReply(
            outgoing=tuple(answers[o.job] for o in outgoing),
            incoming=answers[incoming.job] if incoming is not None else None,
            seconds=time.perf_counter() - started,
            overlapped=overlapped,
            failure=failure,
        )

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
        scanned = await asyncio.to_thread(families, [e.processes for _, e in known])
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
        await self._await_workloads(entry, backend, deadline)
        tags = half.discard_tags if move is Move.SNAPSHOT else ()
        handle = self._handle(entry, pids, dict(half.options), tags)
        return Half(move, entry, record, entry.released, name, backend, handle)

    async def _run_switch(
        self, running: list[Half], epoch: int, headroom: int, deadline: float, started: float
    ) -> tuple[bool, SwitchFailure | None]:
        """Run the admitted halves: two units of the table, as for one move (`_execute`).
        (overlapped, the failure if any)."""
        try:
            for half in running:  # every refusal before anything moves
                if half.move is Move.SNAPSHOT:
                    await self._guard(half.handle, half.backend)
        except Exception:
            for half in running:
                self.tiering.settled(half.handle.job)
            raise
        with self.table.change():
            for half in running:
                half.entry.record = state.begin(half.before, half.move, epoch, half.name)
                half.entry.released = False
        self._refresh_jobs()
        with self.table.change():
            with moves.traced(running, epoch, self.node):
                overlapped = await moves.run_halves(running, headroom, deadline)
            failure = moves.settle_halves(running, epoch, time.perf_counter() - started)
        return overlapped, failure
