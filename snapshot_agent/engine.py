"""The agent's engine: jobs, their processes and their moves, with no gRPC in sight.

The servicers translate requests into these calls and rlslice errors into status codes.
Each move runs as its own task, shielded from the caller: a caller that gives up does not
cut a copy in half, and the result is kept for a repeat with the same epoch.

The engine holds the jobs and their locks and commits the job table; which backend serves a
job is `registry`'s, whether a move goes ahead is `state.admit`'s (pure), and running the
backend calls (with a switch's undo) is `moves`'s. Every change to the table is one unit of
work (`JobTable.change`), written once as it ends, on the rollback path too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
    Set,
)
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from rlslice._errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from rlslice._ids import validate_id
from rlslice.snapshot_agent import moves, state
from rlslice.snapshot_agent.backends import BackendEntry
from rlslice.snapshot_agent.backends.base import (
    Backend,
    BackendError,
    DeviceUsage,
    JobHandle,
    MoveOutcome,
    ProbeResult,
    WorkloadLink,
)
from rlslice.snapshot_agent.discovery import pod_uid_of
from rlslice.snapshot_agent.jobs import JobEntry, JobTable, LocalServer
from rlslice.snapshot_agent.metrics import AgentMetrics
from rlslice.snapshot_agent.moves import Half, MoveReply, SwitchFailure, SwitchHalf, SwitchReply
from rlslice.snapshot_agent.processes import ExitWatcher, ProcessRef, alive, families, family
from rlslice.snapshot_agent.registry import BackendRegistry
from rlslice.snapshot_agent.state import JobState, Move
from rlslice.snapshot_agent.tiering import TieredBackend, Tiering

__all__ = [
    "MAX_EPOCH",
    "WORKLOAD_ATTACH_SECONDS",
    "AgentEngine",
    "JobView",
    "MoveReply",
    "StatusView",
    "SwitchFailure",
    "SwitchHalf",
    "SwitchReply",
    "host_available",
]

log = logging.getLogger(__name__)

MAX_EPOCH = 2**62
#: Longest a move waits for an `app` job's workload stream to attach (see `_await_workloads`).
WORKLOAD_ATTACH_SECONDS = 10.0


@dataclass(frozen=True)
class JobView:
    """One job, for Status."""

    record: state.JobRecord
    pids: tuple[int, ...]
    device_bytes: int
    host_bytes: int
    backend: str


@dataclass(frozen=True)
class StatusView:
    """Everything Status reports."""

    node: str
    jobs: tuple[JobView, ...]
    devices: tuple[DeviceUsage, ...]
    host_available: int
    backends: tuple[str, ...]
    default_backend: str


def host_available() -> int:
    """Host memory available now, bytes."""
    return int(psutil.virtual_memory().available)


def _check_epoch(epoch: int) -> None:
    if isinstance(epoch, bool) or not 0 <= epoch <= MAX_EPOCH:
        raise InvalidArgumentError(f"epoch: {epoch} is outside [0, {MAX_EPOCH}]")


class AgentEngine:
    """Jobs on one node and the moves of their device state."""

    def __init__(
        self,
        *,
        node: str,
        state_dir: Path,
        default_backend: str,
        backend_options: Callable[[str], Mapping[str, str]],
        host_reserve_bytes: int,
        metrics: AgentMetrics,
        backends: Mapping[str, BackendEntry] | None = None,
        host_memory: Callable[[], int] = host_available,
        tiering: Tiering | None = None,
    ) -> None:
        self.node = node
        self.tiering = tiering or Tiering(node=node, spill_dir=None, budget=None)
        """The host budget and the disk tier below it (inert without a budget)."""
        self.default_backend = default_backend
        self._state_dir = state_dir
        self._reserve = host_reserve_bytes
        self._host_memory = host_memory
        self.metrics = metrics
        self.backends = BackendRegistry(
            node=node,
            state_dir=state_dir,
            default=default_backend,
            options=backend_options,
            entries=backends,
            wrap=self.tiering.wrap,
        )
        """Which backend serves a job, and the backends, created on first use."""
        self.table = JobTable(state_dir)
        self._watcher = ExitWatcher(self._on_exit)
        self._tasks: set[asyncio.Task[object]] = set()
        self.before_move: Callable[[], Awaitable[None]] | None = None
        """Called before every move (Kubernetes mode: rediscover the jobs' processes)."""
        self._discovered: set[str] = set()  # jobs whose processes discovery sets

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Create the default backend and re-read every job's state (after a restart)."""
        self._state_dir.mkdir(parents=True, exist_ok=True)
        await self.backend(self.default_backend)
        self.table.load()
        with self.table.change():  # the recovery, one unit (nothing else runs yet)
            for entry in list(self.table.entries.values()):
                entry.processes = {ref for ref in entry.processes if alive(ref)}
                for ref in entry.processes:
                    self._watcher.watch(ref)
                await self._recover(entry)
        await self.refresh_metrics()

    async def _recover(self, entry: JobEntry) -> None:
        record = entry.record
        try:
            backend = await self.backend(self.backends.serving(entry))
            seen = await backend.state(self._handle(entry, family(entry.processes)))
        except (FailedPreconditionError, InvalidArgumentError, BackendError) as error:
            log.warning(
                "job %s: cannot re-read its state (%s); keeping %s",
                record.job,
                error,
                record.state.value,
            )
            return
        entry.record = state.recovered(record, seen.value)
        log.info("job %s: re-read as %s", record.job, entry.record.state.value)
        if not entry.processes and (entry.record.state_on_device or entry.released):
            await self._drop(entry, backend)

    async def close(self) -> None:
        """Wait for moves under way, stop watching processes."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        self._watcher.close()

    # -- backends ----------------------------------------------------------------------

    async def backend(self, name: str) -> Backend:
        """The backend `name`, created on first use; refuses one that is not usable here."""
        return await self.backends.get(name)

    async def probe(self) -> list[tuple[str, ProbeResult]]:
        """Every installed backend: usable here or why not."""
        return await self.backends.probe()

    # -- local registration ------------------------------------------------------------

    def register(
        self,
        ref: ProcessRef,
        job: str,
        group: str,
        *,
        backend: str = "",
        modes: Sequence[str] = (),
        tags: Sequence[str] = (),
        local_server: LocalServer | None = None,
        uid: int | None = None,
    ) -> str:
        """Add the verified process `ref` to `job`; return the backend the job will use.

        `uid` is the caller's uid from the socket's peer credentials: the first registrant
        binds the job to its uid, and a process of another uid (root included) or, where the
        job's processes live in pods, of another pod is refused PERMISSION_DENIED.
        """
        validate_id(job, "job")
        validate_id(group, "group")
        self.backends.require_installed(backend)
        _check_binding(self.table.entries.get(job), job, ref, uid)
        owner = self.table.owner_of(ref)
        if owner is not None and owner.record.job != job:
            raise FailedPreconditionError(
                f"pid {ref.pid} is registered to job {owner.record.job} already"
            )
        entry = self.table.entries.get(job)
        if entry is not None and entry.record.group != group:
            raise FailedPreconditionError(
                f"group: job {job} is registered in group {entry.record.group} on this node"
            )
        with self.table.change():
            if entry is None:
                entry = JobEntry(state.JobRecord(job=job, group=group))
                self.table.entries[job] = entry
            if entry.owner_uid is None:
                entry.owner_uid = uid
            entry.processes.add(ref)
            entry.gone.clear()
            entry.backend = backend or entry.backend
            entry.modes = tuple(modes) or entry.modes
            entry.tags = tuple(tags) or entry.tags
            entry.local_server = local_server or entry.local_server
            self._watcher.watch(ref)
        self._refresh_jobs()
        return entry.backend or self.default_backend

    def adopt(self, found: Mapping[str, tuple[str, frozenset[ProcessRef]]]) -> None:
        """Kubernetes mode: the processes of each discovered job (job -> (group, refs)).

        They come from the job's pods on this node (pod UID -> cgroup -> pid, checked by
        start time), so they count as verified, like a peer-credential registration, and
        they replace whatever registered for those jobs through the socket. A job found
        before and missing now has lost its pods: its processes go, as on an exit.
        """
        changed = False
        with self.table.change():  # written only if something changed
            for job, (group, refs) in found.items():
                entry = self.table.entries.get(job)
                if entry is None:
                    entry = JobEntry(state.JobRecord(job=job, group=group))
                    self.table.entries[job] = entry
                    changed = True
                elif entry.record.group != group:
                    log.warning(
                        "job %s: found in group %s, known in %s", job, group, entry.record.group
                    )
                    continue
                mine = {r for r in refs if self.table.owner_of(r) in (None, entry)}
                changed |= self._set_processes(entry, mine)
            for job in self._discovered - set(found):
                entry = self.table.entries.get(job)
                if entry is not None:
                    changed |= self._set_processes(entry, set())
        self._discovered = set(found)
        if changed:
            self._refresh_jobs()

    def _set_processes(self, entry: JobEntry, refs: set[ProcessRef]) -> bool:
        if refs == entry.processes:
            return False
        for ref in entry.processes - refs:
            self._watcher.forget(ref)
        for ref in refs - entry.processes:
            self._watcher.watch(ref)
        entry.processes = set(refs)
        if not refs:
            entry.gone.set()
            self._spawn(self._drop_if_gone(entry))
        else:
            entry.gone.clear()
        return True

    def attach_workload(self, job: str, link: WorkloadLink) -> None:
        """Add an open workload stream to a registered job."""
        entry = self.table.entries[job]
        entry.workloads.append(link)
        entry.streams_ended = False
        entry.attached.set()

    def detach_workload(self, job: str, link: WorkloadLink) -> None:
        """Remove a closed workload stream."""
        entry = self.table.entries.get(job)
        if entry is not None and link in entry.workloads:
            entry.workloads.remove(link)
            if not entry.workloads:
                entry.attached.clear()
                entry.streams_ended = True

    async def _await_workloads(self, entry: JobEntry, backend: Backend, deadline: float) -> None:
        """A job moved through its own processes (`app`) whose stream is not open yet (it
        registered a moment ago, or this agent restarted and it is reconnecting) gets up to
        WORKLOAD_ATTACH_SECONDS for it, within the move's deadline; then the backend says
        what is missing. A job whose streams closed while this agent ran (its offload loop
        ended: it is leaving) gets no wait, and the wait ends when its last process exits:
        the switch fails at once and its retry goes on without the job."""
        if entry.workloads or entry.streams_ended or entry.gone.is_set():
            return
        if not getattr(backend, "needs_workloads", False):
            return
        wait = min(WORKLOAD_ATTACH_SECONDS, deadline - time.time())
        if wait > 0:
            waits = {
                asyncio.ensure_future(entry.attached.wait()),
                asyncio.ensure_future(entry.gone.wait()),
            }
            try:
                await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()

    def _on_exit(self, ref: ProcessRef) -> None:
        entry = self.table.owner_of(ref)
        if entry is None:
            return
        with self.table.change():
            entry.processes.discard(ref)
        self._watcher.forget(ref)
        log.info("job %s: process %d exited", entry.record.job, ref.pid)
        if not entry.processes:
            entry.gone.set()
            self._spawn(self._drop_if_gone(entry))

    async def _drop_if_gone(self, entry: JobEntry) -> None:
        async with entry.lock:
            if entry.processes or not (entry.record.state_on_device or entry.released):
                return  # parked state stays until the scheduler releases it
            if self.table.entries.get(entry.record.job) is not entry:
                return
            try:
                backend = await self.backend(self.backends.serving(entry))
                with self.table.change():
                    await self._drop(entry, backend)
            except (FailedPreconditionError, InvalidArgumentError, BackendError) as error:
                log.warning("job %s: could not free its memory: %s", entry.record.job, error)

    async def _drop(self, entry: JobEntry, backend: Backend) -> int:
        """Free the job's memory and forget it, within the caller's unit of the table."""
        freed = await backend.release(self._handle(entry, ()))
        self.table.entries.pop(entry.record.job, None)
        self._refresh_jobs()
        log.info("job %s: dropped (%d parked bytes freed)", entry.record.job, freed)
        return freed

    def _spawn(self, work: Coroutine[Any, Any, object]) -> asyncio.Task[object]:
        task: asyncio.Task[object] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- moves -------------------------------------------------------------------------

    def _handle(
        self,
        entry: JobEntry,
        pids: tuple[int, ...],
        options: Mapping[str, str] | None = None,
        discard_tags: Sequence[str] = (),
    ) -> JobHandle:
        return JobHandle(
            job=entry.record.job,
            group=entry.record.group,
            pids=pids,
            workloads=tuple(entry.workloads),
            options=dict(options or {}),
            discard_tags=tuple(discard_tags),
        )

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
        """Snapshot or restore `job` on this node for `epoch`; see `state.decide`."""
        validate_id(job, "job")
        validate_id(group, "group")
        _check_epoch(epoch)
        BackendRegistry.check_asked(backend)
        deadline = time.time() + timeout
        task = self._spawn(
            self._move(
                move, job, group, epoch, backend, dict(options or {}), discard_tags, deadline
            )
        )
        result = await asyncio.shield(task)
        assert isinstance(result, MoveReply)
        return result

    async def _move(
        self,
        move: Move,
        job: str,
        group: str,
        epoch: int,
        asked: str,
        options: dict[str, str],
        discard_tags: Sequence[str],
        deadline: float,
    ) -> MoveReply:
        if self.before_move is not None:
            await self.before_move()
        entry = self.table.entries.get(job)
        if entry is None:
            return MoveReply(job, None, absent=True, epoch=epoch)
        async with entry.lock:
            (pids,) = await asyncio.to_thread(families, [entry.processes])
            decision = state.admit(
                entry.record, move, epoch, group=group, node=self.node, has_processes=bool(pids)
            )
            answer = moves.early_answer(decision, job, entry.record, epoch)
            if answer is not None:
                return answer
            name = self.backends.for_move(entry, move, asked)
            backend = await self.backend(name)
            await self._await_workloads(entry, backend, deadline)
            handle = self._handle(entry, pids, options, discard_tags)
            if move is Move.SNAPSHOT:
                await self._guard(handle, backend)
            outcome = await self._execute(entry, move, epoch, name, backend, handle, deadline)
        await self._observe(move, name, outcome.bytes, outcome.seconds)
        result = entry.record.last
        assert result is not None
        return MoveReply(job, result.state, result.bytes, result.seconds, False, False, epoch, name)

    async def _execute(
        self,
        entry: JobEntry,
        move: Move,
        epoch: int,
        name: str,
        backend: Backend,
        handle: JobHandle,
        deadline: float,
    ) -> MoveOutcome:
        """Run one admitted move: two units of the table, the move begun (on disk before
        the backend acts, so that a restart knows it was under way) and its end."""
        before = (entry.record, entry.released)
        with self.table.change():
            entry.record = state.begin(entry.record, move, epoch, name)
            entry.released = False  # the scheduler uses the job again
        self._refresh_jobs()
        started = time.perf_counter()
        with self.table.change():  # written once, however the move ends
            try:
                async with moves.move_span(move, handle, epoch, self.node, name) as traced:
                    outcome = await moves.run(backend, move, handle, deadline)
                    traced.set(seconds=outcome.seconds, bytes=outcome.bytes)
            except Exception as error:
                seconds = time.perf_counter() - started
                entry.record, entry.released = moves.after_failure(
                    error, before, entry.record, move, epoch, seconds
                )
                self._refresh_jobs()
                raise moves.move_error(error, move, handle.job) from error
            entry.record = state.succeed(entry.record, move, epoch, outcome.bytes, outcome.seconds)
        return outcome

    # -- switches (one node's half of a group switch) -----------------------------------

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
        _check_epoch(epoch)
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
        if self.before_move is not None:
            await self.before_move()
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

    async def _guard(self, handle: JobHandle, backend: Backend) -> None:
        if isinstance(backend, TieredBackend):
            # The disk tier first: spill others until the park fits the host budget and
            # leaves the reserve free (their parked copies are host memory), then check.
            nbytes = await backend.device_bytes(handle)
            short = nbytes + self._reserve - self._host_memory()
            await self.tiering.make_room(handle.job, nbytes, shortfall=short)
        await moves.guard(
            handle, backend, host_available=self._host_memory(), reserve=self._reserve
        )

    async def _observe(self, move: Move, backend: str, nbytes: int, seconds: float) -> None:
        self._count(move, backend, nbytes, seconds)
        await self.refresh_metrics()

    def _count(self, move: Move, backend: str, nbytes: int, seconds: float) -> None:
        if move is Move.SNAPSHOT:
            self.metrics.snapshot_seconds.labels(backend=backend).observe(seconds)
            self.metrics.moved_bytes.labels(direction="out").inc(nbytes)
        else:
            self.metrics.restore_seconds.labels(backend=backend).observe(seconds)
            self.metrics.moved_bytes.labels(direction="in").inc(nbytes)

    # -- release and status ------------------------------------------------------------

    async def release(self, job: str, group: str, *, force: bool) -> tuple[int, bool]:
        """Forget `job` here; (host bytes freed, released). Kept while it lives, unless forced."""
        validate_id(job, "job")
        validate_id(group, "group")
        entry = self.table.entries.get(job)
        if entry is None:
            raise NotFoundError(f"job: {job} is not known on node {self.node}")
        if entry.record.group != group:
            raise FailedPreconditionError(
                f"group: job {job} is in group {entry.record.group} on node {self.node}"
            )
        async with entry.lock:
            pids = family(entry.processes)
            if pids and not force:
                # Kept while the job lives; dropped by `_drop_if_gone` once it is gone (the
                # scheduler does not ask twice).
                with self.table.change():
                    entry.released = True
                return 0, False
            backend = await self.backend(self.backends.serving(entry))
            freed = await backend.release(self._handle(entry, pids))
            with self.table.change():
                self._released(entry, pids)
        await self.refresh_metrics()
        return freed, True

    def _released(self, entry: JobEntry, pids: tuple[int, ...]) -> None:
        """The table after a job's parked copy was dropped."""
        if pids:
            # Released before its processes exit (the job unregistered, then ends): the
            # parked copy is gone and the processes run; keep watching them, so that
            # `_drop_if_gone` frees their device memory when they are gone.
            entry.record = dataclasses.replace(
                entry.record,
                state=JobState.RUNNING,
                parked_bytes=0,
                reason="",
                faulted_in=None,
            )
            entry.released = True
        else:
            for ref in entry.processes:
                self._watcher.forget(ref)
            self.table.entries.pop(entry.record.job, None)

    async def forget_departed(self, known: Mapping[str, Set[str]]) -> list[str]:
        """Drop each job of the groups in `known` (group -> the jobs the scheduler knows
        there) that the scheduler no longer knows and whose processes are all gone: its
        Release was lost while this agent could not hear it (it was down), and nothing will
        ask again. A job whose processes live is kept (a fenced copy stays while they do).
        The jobs dropped, in name order."""
        dropped = []
        for job, entry in sorted(self.table.entries.items()):
            group = entry.record.group
            if group not in known or job in known[group] or entry.processes:
                continue
            async with entry.lock:
                if entry.processes or self.table.entries.get(job) is not entry:
                    continue
                backend = await self.backend(self.backends.serving(entry))
                with self.table.change():
                    await self._drop(entry, backend)
            log.warning("job %s: dropped, unknown to the scheduler and gone (a lost Release)", job)
            dropped.append(job)
        if dropped:
            await self.refresh_metrics()
        return dropped

    async def status(self) -> StatusView:
        """Jobs, devices and host memory on this node."""
        views = []
        default = await self.backend(self.default_backend)
        for entry in list(self.table.entries.values()):
            record = entry.record
            pids = family(entry.processes)
            name = self.backends.serving(entry)
            device = 0
            loaded = self.backends.loaded(name)
            if record.state_on_device and loaded is not None:
                device = await loaded.device_bytes(self._handle(entry, pids))
            host = record.parked_bytes if record.state_in_host else 0
            host = max(0, host - self.tiering.disk_bytes(record.job))  # on disk: not host
            views.append(JobView(record, pids, device, host, name))
        devices = tuple(await default.devices())
        usable = tuple(name for name, probe in await self.probe() if probe.usable)
        return StatusView(
            self.node, tuple(views), devices, self._host_memory(), usable, self.default_backend
        )

    def _refresh_jobs(self) -> None:
        records = [e.record for e in self.table.entries.values()]
        parked = sum(r.parked_bytes for r in records if r.state_in_host)
        parked = max(0, parked - self.tiering.disk_bytes())  # the disk tier's are not host
        self.metrics.observe_jobs((r.state for r in records), parked)

    async def refresh_metrics(self) -> None:
        """Refresh the gauges (after a move, at start, on Status)."""
        self._refresh_jobs()
        try:
            devices = await (await self.backend(self.default_backend)).devices()
        except Exception as error:  # metrics must never break a move
            log.debug("device usage unavailable: %s", error)
            devices = []
        self.metrics.observe_memory(devices, self._host_memory())
        self.tiering.observe()
        self.metrics.pinned_bytes.set(
            sum(b.pinned_total() for b in self.backends.instances() if hasattr(b, "pinned_total"))
        )


def _check_binding(entry: JobEntry | None, job: str, ref: ProcessRef, uid: int | None) -> None:
    """Refuse a registrant that is not the job's: another uid than the one that first
    registered it, or (when the job's live processes are in pods) a process of another pod.
    Root gets no exemption: uid 0 in a container is not the node's administrator."""
    if entry is None:
        return
    if uid is not None and entry.owner_uid is not None and uid != entry.owner_uid:
        raise PermissionDeniedError(
            f"job {job} is registered on this node by uid {entry.owner_uid}, not uid {uid}"
        )
    pods = {pod_uid_of(p.cgroup) for p in entry.processes if alive(p)} - {None}
    if pods and pod_uid_of(ref.cgroup) not in pods:
        raise PermissionDeniedError(f"job {job} is registered on this node from other pods")
