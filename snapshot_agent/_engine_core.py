"""The engine's shared part: its state, and the helpers that moves, switches and registration use.

`AgentEngine` (engine.py) sets the attributes declared here in its constructor; the parts
that serve registration (`_registration`) and switches (`_switching`) build on this class,
so each reads one declared set of fields.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from rlslice._errors import InvalidArgumentError
from rlslice.snapshot_agent import moves, state
from rlslice.snapshot_agent.backends.base import (
    Backend,
    DeviceUsage,
    JobHandle,
    ProbeResult,
)
from rlslice.snapshot_agent.jobs import JobEntry, JobTable
from rlslice.snapshot_agent.metrics import AgentMetrics
from rlslice.snapshot_agent.processes import ExitWatcher, ProcessSource
from rlslice.snapshot_agent.registry import BackendRegistry
from rlslice.snapshot_agent.state import Move
from rlslice.snapshot_agent.tiering import TieredBackend, Tiering

# The engine's one logger, whichever part of it logs.
log = logging.getLogger("rlslice.snapshot_agent.engine")

MAX_EPOCH = 2**62
#: Longest a move waits for an `app` job's workload stream to attach (see `_await_workloads`).
WORKLOAD_ATTACH_SECONDS = 10.0


@dataclass(frozen=True)
class AgentJobView:
    """One job, for Status."""

    record: state.AgentJobRecord
    pids: tuple[int, ...]
    device_bytes: int
    host_bytes: int
    backend: str


@dataclass(frozen=True)
class StatusView:
    """Everything Status reports."""

    node: str
    jobs: tuple[AgentJobView, ...]
    devices: tuple[DeviceUsage, ...]
    host_available: int
    backends: tuple[str, ...]
    default_backend: str


def host_available() -> int:
    """Host memory available now, bytes."""
    return int(psutil.virtual_memory().available)


def check_epoch(epoch: int) -> None:
    """Refuse an epoch outside [0, MAX_EPOCH] (a bool included)."""
    if isinstance(epoch, bool) or not 0 <= epoch <= MAX_EPOCH:
        raise InvalidArgumentError(f"epoch: {epoch} is outside [0, {MAX_EPOCH}]")


class EngineCore:
    """The engine's state and shared helpers (the fields are set by `AgentEngine`)."""

    node: str
    tiering: Tiering
    default_backend: str
    metrics: AgentMetrics
    backends: BackendRegistry
    table: JobTable
    _state_dir: Path
    _reserve: int
    _host_memory: Callable[[], int]
    _watcher: ExitWatcher
    _tasks: set[asyncio.Task[object]]
    _discovered: set[str]
    _processes: ProcessSource | None

    # -- backends ----------------------------------------------------------------------

    async def backend(self, name: str) -> Backend:
        """The backend `name`, created on first use; refuses one that is not usable here."""
        return await self.backends.get(name)

    async def probe(self) -> list[tuple[str, ProbeResult]]:
        """Every installed backend: usable here or why not."""
        return await self.backends.probe()

    async def _await_workloads(self, entry: JobEntry, backend: Backend, deadline: float) -> None:
        """(`deadline`: the loop's clock.) A job moved through its own processes (`app`) whose stream is not open yet (it
        registered a moment ago, or this agent restarted and it is reconnecting) gets up to
        WORKLOAD_ATTACH_SECONDS for it, within the move's deadline; then the backend says
        what is missing. A job whose streams closed while this agent ran (its offload loop
        ended: it is leaving) gets no wait, and the wait ends when its last process exits:
        the switch fails at once and its retry goes on without the job."""
        if entry.workloads or entry.streams_ended or entry.gone.is_set():
            return
        if not backend.needs_workloads:
            return
        wait = min(WORKLOAD_ATTACH_SECONDS, deadline - asyncio.get_running_loop().time())
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
        self.metrics.pinned_bytes.set(sum(b.pinned_total() for b in self.backends.instances()))
