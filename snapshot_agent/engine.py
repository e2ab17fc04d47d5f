"""The agent's engine: jobs, their processes and their moves, with no gRPC in sight.

The servicers translate requests into these calls and rlslice errors into status codes.
Each move runs as its own task, shielded from the caller: a caller that gives up does not
cut a copy in half, and the result is kept for a repeat with the same epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from rlslice._errors import (
    AbortedError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from rlslice._ids import validate_id
from rlslice.adapters.tracing import RESTORE, SNAPSHOT, span
from rlslice.snapshot_agent import memguard, state
from rlslice.snapshot_agent.backends import BackendEntry, installed_backends
from rlslice.snapshot_agent.backends.base import (
    Backend,
    BackendContext,
    BackendError,
    DeviceMemoryError,
    DeviceUsage,
    JobHandle,
    MoveOutcome,
    OptionsError,
    ProbeResult,
    SupportsSwap,
    SwapError,
    WorkloadLink,
)
from rlslice.snapshot_agent.jobs import JobEntry, JobTable, LocalServer
from rlslice.snapshot_agent.metrics import AgentMetrics
from rlslice.snapshot_agent.processes import ExitWatcher, ProcessRef, alive, families, family
from rlslice.snapshot_agent.state import JobState, Move

log = logging.getLogger(__name__)

MAX_EPOCH = 2**62
#: Longest a move waits for an `app` job's workload stream to attach (see `_await_workloads`).
WORKLOAD_ATTACH_SECONDS = 10.0


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
class _Half:
    """One move of a Switch under way."""

    move: Move
    entry: JobEntry
    before: state.JobRecord
    released: bool
    name: str
    backend: Backend
    handle: JobHandle
    outcome: MoveOutcome | None = None
    error: BaseException | None = None
    undone: bool = False


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
    ) -> None:
        self.node = node
        self.default_backend = default_backend
        self._state_dir = state_dir
        self._options = backend_options
        self._reserve = host_reserve_bytes
        self._host_memory = host_memory
        self.metrics = metrics
        self._entries = dict(backends) if backends is not None else installed_backends()
        self._backends: dict[str, Backend] = {}
        self._probes: dict[str, ProbeResult] = {}
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
        for entry in list(self.table.entries.values()):
            entry.processes = {ref for ref in entry.processes if alive(ref)}
            for ref in entry.processes:
                self._watcher.watch(ref)
            await self._recover(entry)
        self.table.save()
        await self.refresh_metrics()

    async def _recover(self, entry: JobEntry) -> None:
        record = entry.record
        name = record.backend or entry.backend or self.default_backend
        try:
            backend = await self.backend(name)
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
        if name in self._backends:
            return self._backends[name]
        entry = self._entries.get(name)
        if entry is None:
            installed = ", ".join(self._entries) or "none"
            raise InvalidArgumentError(
                f"backend: {name!r} is not installed on node {self.node} (installed: {installed})"
            )
        if entry.cls is None:
            raise FailedPreconditionError(
                f"backend: {name!r} cannot load on node {self.node}: {entry.error}"
            )
        known = self._probes.get(name)
        if known is None:
            known = await self._create(name, entry.cls)
        if not known.usable:
            raise FailedPreconditionError(
                f"backend: {name!r} is not usable on node {self.node}: {known.detail}"
            )
        return self._backends[name]

    async def _create(self, name: str, cls: type[Backend]) -> ProbeResult:
        context = BackendContext(
            node=self.node,
            state_dir=self._state_dir / "backends" / name,
            options=dict(self._options(name)),
        )
        try:
            context.state_dir.mkdir(parents=True, exist_ok=True)
            instance = cls(context)
            probe = await instance.probe()
        except Exception as error:  # a backend that cannot even start is unusable here
            probe = ProbeResult(False, f"failed to start: {type(error).__name__}: {error}")
        else:
            if probe.usable:
                self._backends[name] = instance
        self._probes[name] = probe
        return probe

    async def probe(self) -> list[tuple[str, ProbeResult]]:
        """Every installed backend: usable here or why not."""
        results: list[tuple[str, ProbeResult]] = []
        for name, entry in self._entries.items():
            if entry.cls is None:
                results.append((name, ProbeResult(False, f"cannot load: {entry.error}")))
                continue
            probe = self._probes.get(name) or await self._create(name, entry.cls)
            results.append((name, probe))
        return results

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
    ) -> str:
        """Add the verified process `ref` to `job`; return the backend the job will use."""
        validate_id(job, "job")
        validate_id(group, "group")
        if backend and backend not in self._entries:
            raise InvalidArgumentError(f"backend: {backend!r} is not installed on this node")
        owner = self.table.owner_of(ref)
        if owner is not None and owner.record.job != job:
            raise FailedPreconditionError(
                f"pid {ref.pid} is registered to job {owner.record.job} already"
            )
        entry = self.table.entries.get(job)
        if entry is None:
            entry = JobEntry(state.JobRecord(job=job, group=group))
            self.table.entries[job] = entry
        elif entry.record.group != group:
            raise FailedPreconditionError(
                f"group: job {job} is registered in group {entry.record.group} on this node"
            )
        entry.processes.add(ref)
        entry.gone.clear()
        entry.backend = backend or entry.backend
        entry.modes = tuple(modes) or entry.modes
        entry.tags = tuple(tags) or entry.tags
        entry.local_server = local_server or entry.local_server
        self._watcher.watch(ref)
        self.table.save()
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
            self.table.save()
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
        entry.processes.discard(ref)
        self._watcher.forget(ref)
        log.info("job %s: process %d exited", entry.record.job, ref.pid)
        self.table.save()
        if not entry.processes:
            entry.gone.set()
            self._spawn(self._drop_if_gone(entry))

    async def _drop_if_gone(self, entry: JobEntry) -> None:
        async with entry.lock:
            if entry.processes or not (entry.record.state_on_device or entry.released):
                return  # parked state stays until the scheduler releases it
            if self.table.entries.get(entry.record.job) is not entry:
                return
            name = entry.record.backend or entry.backend or self.default_backend
            try:
                await self._drop(entry, await self.backend(name))
            except (FailedPreconditionError, InvalidArgumentError, BackendError) as error:
                log.warning("job %s: could not free its memory: %s", entry.record.job, error)

    async def _drop(self, entry: JobEntry, backend: Backend) -> int:
        freed = await backend.release(self._handle(entry, ()))
        self.table.entries.pop(entry.record.job, None)
        self.table.save()
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
        if isinstance(epoch, bool) or not 0 <= epoch <= MAX_EPOCH:
            raise InvalidArgumentError(f"epoch: {epoch} is outside [0, {MAX_EPOCH}]")
        if backend:
            validate_id(backend, "backend")
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
            record = entry.record
            if record.group != group:
                raise FailedPreconditionError(
                    f"group: job {job} is in group {record.group} on node {self.node}, not {group}"
                )
            (pids,) = await asyncio.to_thread(families, [entry.processes])
            decision = state.decide(record, move, epoch, has_processes=bool(pids))
            if isinstance(decision, state.Absent):
                return MoveReply(job, record.state, absent=True, epoch=epoch)
            if isinstance(decision, state.Repeat):
                r = decision.result
                return MoveReply(job, r.state, r.bytes, r.seconds, True, False, r.epoch, r.backend)
            if isinstance(decision, state.Refuse):
                raise FailedPreconditionError(decision.message)
            name = self._backend_for(entry, move, asked)
            backend = await self.backend(name)
            await self._await_workloads(entry, backend, deadline)
            handle = self._handle(entry, pids, options, discard_tags)
            if move is Move.SNAPSHOT:
                await self._guard(handle, backend)
            entry.record = state.begin(record, move, epoch, name)
            released, entry.released = entry.released, False  # the scheduler uses the job again
            self.table.save()
            self._refresh_jobs()
            started = time.perf_counter()
            kind = SNAPSHOT if move is Move.SNAPSHOT else RESTORE
            try:
                async with span(
                    kind, group=group, job=job, epoch=epoch, node=self.node, backend=name
                ) as traced:
                    if move is Move.SNAPSHOT:
                        outcome = await backend.snapshot(handle, deadline=deadline)
                    else:
                        outcome = await backend.restore(handle, deadline=deadline)
                    traced.set(seconds=outcome.seconds, bytes=outcome.bytes)
            except Exception as error:
                seconds = time.perf_counter() - started
                reason = str(error) or type(error).__name__
                if isinstance(error, OptionsError):
                    # Refused before anything was done: the job is exactly as it was.
                    entry.record, entry.released = record, released
                    self.table.save()
                    self._refresh_jobs()
                    raise InvalidArgumentError(f"options: {reason}") from error
                entry.record = state.fail(entry.record, move, epoch, reason, seconds)
                self.table.save()
                self._refresh_jobs()
                if isinstance(error, DeviceMemoryError):
                    log.warning("job %s: %s refused: %s", job, move.value, error)
                    raise ResourceExhaustedError(reason) from error
                if not isinstance(error, BackendError):
                    log.exception("job %s: %s failed unexpectedly", job, move.value)
                    raise InternalError(f"{move.value} of job {job} failed: {reason}") from error
                log.warning("job %s: %s failed: %s", job, move.value, error)
                where = (
                    "rolled back, the job keeps running"
                    if move is Move.SNAPSHOT
                    else "the job stays parked"
                )
                raise AbortedError(
                    f"{move.value} of job {job} failed ({where}): {reason}"
                ) from error
            entry.record = state.succeed(entry.record, move, epoch, outcome.bytes, outcome.seconds)
            self.table.save()
        await self._observe(move, name, outcome.bytes, outcome.seconds)
        result = entry.record.last
        assert result is not None
        return MoveReply(job, result.state, result.bytes, result.seconds, False, False, epoch, name)

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
        if isinstance(epoch, bool) or not 0 <= epoch <= MAX_EPOCH:
            raise InvalidArgumentError(f"epoch: {epoch} is outside [0, {MAX_EPOCH}]")
        halves = [*outgoing, *([incoming] if incoming is not None else [])]
        for half in halves:
            validate_id(half.job, "job")
            if half.backend:
                validate_id(half.backend, "backend")
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
        answers: dict[str, MoveReply] = {}
        running: list[_Half] = []
        async with contextlib.AsyncExitStack() as locks:
            for name in sorted(j for j, e in entries.items() if e is not None):
                entry = entries[name]
                assert entry is not None
                await locks.enter_async_context(entry.lock)
            known = [(job, e) for job, e in entries.items() if e is not None]
            scanned = await asyncio.to_thread(families, [e.processes for _, e in known])
            pids_of = {job: pids for (job, _), pids in zip(known, scanned, strict=True)}
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
            if running:
                for half in running:  # every refusal before anything moves
                    if half.move is Move.SNAPSHOT:
                        await self._guard(half.handle, half.backend)
                for half in running:
                    half.entry.record = state.begin(half.before, half.move, epoch, half.name)
                    half.entry.released = False
                self.table.save()
                self._refresh_jobs()
                with contextlib.ExitStack() as spans:
                    # One span per move, as the serial path traces them; they overlap here.
                    traced = [
                        span(
                            SNAPSHOT if half.move is Move.SNAPSHOT else RESTORE,
                            group=group,
                            job=half.before.job,
                            epoch=epoch,
                            node=self.node,
                            backend=half.name,
                        )
                        for half in running
                    ]
                    for one in traced:
                        spans.enter_context(one)
                    overlapped = await self._run_halves(running, headroom, deadline)
                    for half, one in zip(running, traced, strict=True):
                        if half.outcome is not None:
                            one.set(seconds=half.outcome.seconds, bytes=half.outcome.bytes)
                failure = self._settle_halves(running, epoch, time.perf_counter() - started)
                self.table.save()
                for half in running:
                    answers[half.entry.record.job] = self._reply_for(half, epoch)
            else:
                overlapped, failure = False, None
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

    async def _plan_half(
        self,
        entry: JobEntry,
        half: SwitchHalf,
        move: Move,
        group: str,
        epoch: int,
        deadline: float,
        pids: tuple[int, ...],
    ) -> MoveReply | _Half:
        record = entry.record
        job = record.job
        if record.group != group:
            raise FailedPreconditionError(
                f"group: job {job} is in group {record.group} on node {self.node}, not {group}"
            )
        decision = state.decide(record, move, epoch, has_processes=bool(pids))
        if isinstance(decision, state.Absent):
            return MoveReply(job, record.state, absent=True, epoch=epoch)
        if isinstance(decision, state.Repeat):
            r = decision.result
            return MoveReply(job, r.state, r.bytes, r.seconds, True, False, r.epoch, r.backend)
        if isinstance(decision, state.Refuse):
            raise FailedPreconditionError(decision.message)
        name = self._backend_for(entry, move, half.backend)
        backend = await self.backend(name)
        await self._await_workloads(entry, backend, deadline)
        tags = half.discard_tags if move is Move.SNAPSHOT else ()
        handle = self._handle(entry, pids, dict(half.options), tags)
        return _Half(move, entry, record, entry.released, name, backend, handle)

    async def _run_halves(self, halves: list[_Half], headroom: int, deadline: float) -> bool:
        """Run the moves; fill each half's outcome or error and undo the others on a
        failure. True when the restore overlapped the snapshots."""
        outs = [h for h in halves if h.move is Move.SNAPSHOT]
        into = next((h for h in halves if h.move is Move.RESTORE), None)
        backend = halves[0].backend
        if len({h.name for h in halves}) == 1 and isinstance(backend, SupportsSwap):
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
                log.exception("switch: the %s backend failed unexpectedly", backend.name)
                for half in halves:
                    half.error = error
                return False
            for half, outcome in zip(outs, done.outgoing, strict=True):
                half.outcome = outcome
            if into is not None:
                into.outcome = done.incoming
            return done.overlapped
        side_by_side = into is None or not outs or await self._fits(into, headroom)

        async def run(half: _Half) -> None:
            try:
                if half.move is Move.SNAPSHOT:
                    half.outcome = await half.backend.snapshot(half.handle, deadline=deadline)
                else:
                    half.outcome = await half.backend.restore(half.handle, deadline=deadline)
            except Exception as error:
                half.error = error

        if side_by_side:
            await asyncio.gather(*(run(h) for h in halves))
        else:
            await asyncio.gather(*(run(h) for h in outs))
            if into is not None and not any(h.error for h in outs):
                await run(into)
        if any(h.error for h in halves):
            for half in halves:  # undo the halves that went through
                if half.outcome is None:
                    continue
                try:
                    if half.move is Move.SNAPSHOT:
                        await half.backend.restore(half.handle, deadline=deadline + 60)
                    else:
                        await half.backend.snapshot(half.handle, deadline=deadline + 60)
                    half.undone, half.outcome = True, None
                except Exception as error:
                    log.error(
                        "job %s: undoing its %s failed: %s", half.handle.job, half.move.value, error
                    )
        return side_by_side and into is not None and bool(outs)

    async def _fits(self, into: _Half, headroom: int) -> bool:
        """Whether the incoming job's parked bytes fit in free device memory now."""
        devices = await into.backend.devices()
        frees = [d.total_bytes - d.used_bytes for d in devices]
        free = len(frees) * min(frees) if frees else 0
        return into.before.parked_bytes + headroom <= free

    def _settle_halves(
        self, halves: list[_Half], epoch: int, seconds: float
    ) -> SwitchFailure | None:
        """Each half's record after the moves; the failure, if any."""
        failed = next((h for h in halves if h.error is not None), None)
        for half in halves:
            entry = half.entry
            if failed is None and half.outcome is not None:
                entry.record = state.succeed(
                    entry.record, half.move, epoch, half.outcome.bytes, half.outcome.seconds
                )
            elif half.error is not None:
                reason = str(half.error) or type(half.error).__name__
                if isinstance(half.error, OptionsError):
                    entry.record, entry.released = half.before, half.released
                else:
                    entry.record = state.fail(entry.record, half.move, epoch, reason, seconds)
            elif half.outcome is None:  # undone, or never run: as it was
                entry.record, entry.released = half.before, half.released
            else:  # went through and could not be undone: it moved
                entry.record = state.succeed(
                    entry.record, half.move, epoch, half.outcome.bytes, half.outcome.seconds
                )
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

    def _reply_for(self, half: _Half, epoch: int) -> MoveReply:
        record = half.entry.record
        last = record.last
        if last is not None and last.epoch == epoch and last.move is half.move:
            return MoveReply(
                record.job, last.state, last.bytes, last.seconds, False, False, epoch, half.name
            )
        return MoveReply(record.job, record.state, epoch=epoch, backend=half.name)

    def _backend_for(self, entry: JobEntry, move: Move, asked: str) -> str:
        record = entry.record
        if move is Move.RESTORE and record.backend:
            # State parked by one backend comes back through the same one.
            if asked and asked != record.backend:
                raise FailedPreconditionError(
                    f"backend: job {record.job} was parked by {record.backend!r}, not {asked!r}"
                )
            return record.backend
        return asked or entry.backend or self.default_backend

    async def _guard(self, handle: JobHandle, backend: Backend) -> None:
        nbytes = await backend.device_bytes(handle)
        held = getattr(backend, "held_host_bytes", None)
        if held is not None:  # staging the job keeps already: not asked for twice
            nbytes = max(0, nbytes - int(await held(handle)))
        cgroups = await asyncio.to_thread(memguard.cgroup_headrooms, handle.pids)
        reason = memguard.refusal(
            handle.job,
            nbytes,
            host_available=self._host_memory(),
            reserve=self._reserve,
            cgroups=cgroups,
        )
        if reason is not None:
            raise ResourceExhaustedError(f"{reason}; job {handle.job} keeps running")

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
                entry.released = True
                self.table.save()
                return 0, False
            name = entry.record.backend or entry.backend or self.default_backend
            backend = await self.backend(name)
            freed = await backend.release(self._handle(entry, pids))
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
                self.table.entries.pop(job, None)
            self.table.save()
        await self.refresh_metrics()
        return freed, True

    async def status(self) -> StatusView:
        """Jobs, devices and host memory on this node."""
        views = []
        default = await self.backend(self.default_backend)
        for entry in list(self.table.entries.values()):
            record = entry.record
            pids = family(entry.processes)
            name = record.backend or entry.backend or self.default_backend
            device = 0
            if record.state_on_device and name in self._backends:
                device = await self._backends[name].device_bytes(self._handle(entry, pids))
            host = record.parked_bytes if record.state_in_host else 0
            views.append(JobView(record, pids, device, host, name))
        devices = tuple(await default.devices())
        usable = tuple(name for name, probe in await self.probe() if probe.usable)
        return StatusView(
            self.node, tuple(views), devices, self._host_memory(), usable, self.default_backend
        )

    def _refresh_jobs(self) -> None:
        records = [e.record for e in self.table.entries.values()]
        parked = sum(r.parked_bytes for r in records if r.state_in_host)
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
        self.metrics.pinned_bytes.set(
            sum(b.pinned_total() for b in self._backends.values() if hasattr(b, "pinned_total"))
        )
