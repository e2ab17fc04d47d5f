"""The agent's engine: jobs, their processes and their moves, with no gRPC in sight.

The servicers translate requests into these calls and rlslice errors into status codes.
Each move runs as its own task, shielded from the caller: a caller that gives up does not
cut a copy in half, and the result is kept for a repeat with the same epoch. A single
Snapshot or Restore is a switch of one half: the one path is `_switching`'s.

The engine holds the jobs and their locks and commits the job table; which backend serves a
job is `registry`'s, whether a move goes ahead is `state.admit`'s (pure), and running the
backend calls (with a switch's undo) is `moves`'s. Every change to the table is one unit of
work (`JobTable.change`), written once as it ends, on the rollback path too.

The engine is one class in parts, each in its own module: the shared state and helpers
(`_engine_core`), registration of processes and workload streams (`_registration`), and
moves and switches (`_switching`); this module holds the lifecycle, release and status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Set
from pathlib import Path

from rlslice._errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from rlslice._ids import validate_id
from rlslice.snapshot_agent import state
from rlslice.snapshot_agent._engine_core import (
    MAX_EPOCH,
    WORKLOAD_ATTACH_SECONDS,
    AgentJobView,
    StatusView,
    host_available,
)
from rlslice.snapshot_agent._registration import RegistrationMixin
from rlslice.snapshot_agent._switching import SwitchingMixin
from rlslice.snapshot_agent.backends import BackendEntry
from rlslice.snapshot_agent.backends.base import BackendError
from rlslice.snapshot_agent.jobs import JobEntry, JobTable
from rlslice.snapshot_agent.metrics import AgentMetrics
from rlslice.snapshot_agent.moves import MoveReply, SwitchFailure, SwitchHalf, SwitchReply
from rlslice.snapshot_agent.processes import (
    ExitWatcher,
    ProcessSource,
    alive,
    family,
)
from rlslice.snapshot_agent.registry import BackendRegistry
from rlslice.snapshot_agent.tiering import TieredBackend, Tiering

__all__ = [
    "MAX_EPOCH",
    "WORKLOAD_ATTACH_SECONDS",
    "AgentEngine",
    "AgentJobView",
    "MoveReply",
    "StatusView",
    "SwitchFailure",
    "SwitchHalf",
    "SwitchReply",
    "host_available",
]

log = logging.getLogger(__name__)


class AgentEngine(RegistrationMixin, SwitchingMixin):
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
        processes: ProcessSource | None = None,
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
        self._tasks = set()
        self._processes = processes
        """Asked before every move to bring the jobs' processes up to date (Kubernetes
        mode: rediscover them); None: registration alone tells them."""
        self._discovered = set()  # jobs whose processes discovery sets

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
                    entry.record = state.release_kept(entry.record)
                return 0, False
            backend = await self.backend(self.backends.serving(entry))
            freed = await backend.release(self._handle(entry, pids))
            with self.table.change():
                self._released(entry, pids)
        await self.refresh_metrics()
        return freed, True

    async def prefetch(self, job: str, group: str) -> int:
        """Read the spilled parts of parked `job` back into host memory ahead of its restore
        (`Tiering.prefetch`); bytes read. 0 when it has nothing on disk or is not parked."""
        validate_id(job, "job")
        validate_id(group, "group")
        entry = self.table.entries.get(job)
        if entry is None:
            raise NotFoundError(f"job: {job} is not known on node {self.node}")
        if entry.record.group != group:
            raise FailedPreconditionError(
                f"group: job {job} is in group {entry.record.group} on node {self.node}"
            )
        if entry.lock.locked():
            # The job is moving (or being released) now: a fill ahead of a restore that is
            # already under way gains nothing, and waiting for it would hold the
            # scheduler's switch slot until the move ends.
            return 0
        async with entry.lock:  # no restore or release of the job meanwhile
            if entry.record.state is not state.JobState.PARKED:
                return 0
            backend = await self.backend(self.backends.serving(entry))
            if not isinstance(backend, TieredBackend):
                return 0
            try:
                filled = await self.tiering.prefetch(
                    job, host_free=self._host_memory, reserve=self._reserve
                )
            except BackendError as error:  # a spill file missing or damaged
                log.warning("job %s: prefetch failed: %s", job, error)
                raise AbortedError(
                    f"prefetch of job {job} failed (the job stays parked): {error}"
                ) from error
        if filled:
            self._refresh_jobs()
            await self.refresh_metrics()
        return filled

    def _released(self, entry: JobEntry, pids: tuple[int, ...]) -> None:
        """The table after a job's parked copy was dropped."""
        if pids:
            # Released before its processes exit (the job unregistered, then ends): the
            # parked copy is gone and the processes run; keep watching them, so that
            # `_drop_if_gone` frees their device memory when they are gone.
            entry.record = state.released_running(entry.record)
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
            views.append(AgentJobView(record, pids, device, host, name))
        devices = tuple(await default.devices())
        usable = tuple(name for name, probe in await self.probe() if probe.usable)
        return StatusView(
            self.node, tuple(views), devices, self._host_memory(), usable, self.default_backend
        )
