"""The disk tier below host memory: parked parts spilled to a local directory and back.

With a host budget (`--host-budget`) the agent keeps at most that many bytes of parked
state in host memory. Before a park (a snapshot) that would break it, `Tiering.make_room`
spills parts of other parked jobs, least recently parked first (`spill_choice.choose`), to
the spill directory (`--spill-dir`, through `spill`); a park that cannot fit even so, or
whose spill finds the disk full, is refused before anything moves, and nothing already
parked is lost. A restore first fills the job's spilled parts back into host memory
(making room the same way), verified, so the backend sees its parked copy as it left it.
`prefetch` does the same ahead of time, while the holder runs, for the next waiter: its
restore then reads nothing from disk, and the job counts as just used, so a park that needs
room spills other parked jobs' parts before its own.

Every spill and fill is counted (`metrics`) and told to whoever is recording in the calling
context (`tier_moves.recording()`: the agent's RPCs, whose answers carry the moves for the
timeline's spill lane), one `TierMove` per job and direction.

Where each part is, is written in the tier index, one JSON file per job beside its spill
files (`<spill-dir>/<node>/<job>/index.json`, fsynced before the host copy is dropped), so
a restarted agent finds spilled bytes where it left them; `recover()` settles a spill or
fill that an agent stop cut off (the host copy, when whole, wins; stray files go).

Only backends that `SupportsSpill` (parked copies as host-memory files: `sim`) are
tiered; `wrap` puts a `TieredBackend` in front of one, and the agent calls it as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from rlslice._errors import ResourceExhaustedError
from rlslice.snapshot_agent import spill, spill_choice, tier_moves
from rlslice.snapshot_agent.backends.base import (
    Backend,
    BackendError,
    BackendState,
    DeviceUsage,
    JobHandle,
    MoveOutcome,
    ProbeResult,
    SupportsSpill,
    SupportsSwap,
    SwapError,
    SwapOutcome,
)
from rlslice.snapshot_agent.metrics import AgentMetrics
from rlslice.units import format_bytes

__all__ = ["INDEX", "TieredBackend", "Tiering"]

log = logging.getLogger(__name__)

INDEX = "index.json"


class Tiering:
    """The host budget and the spill directory of one agent (both optional)."""

    def __init__(
        self,
        *,
        node: str,
        spill_dir: Path | None,
        budget: int | None,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.root = spill_dir / node if spill_dir is not None else None
        self.budget = budget
        self.metrics = metrics
        self._backend: SupportsSpill | None = None
        self._index: dict[str, dict[str, spill.SpillRecord]] = {}
        self._reserved: dict[str, int] = {}
        self._busy: dict[str, int] = {}  # jobs whose parked copy a move is reading now
        self._used: dict[str, float] = {}  # job -> when a prefetch filled it (Unix time)
        self.lock = asyncio.Lock()
        """Held while parts spill or fill, and while a tiered job is released."""

    @property
    def enabled(self) -> bool:
        """Whether there is a budget to keep (without one nothing is ever spilled)."""
        return self.budget is not None

    def wrap(self, backend: Backend) -> Backend:
        """`backend` behind the tier when it supports one (and the tier is enabled)."""
        if not self.enabled or not isinstance(backend, SupportsSpill):
            return backend
        if not isinstance(backend, SupportsSwap):
            return backend  # every tiered backend swaps today (sim); nothing to wrap
        self._backend = backend
        self.recover()  # the index of what this backend's jobs have on disk
        return cast(Backend, TieredBackend(backend, self))

    # -- the index -----------------------------------------------------------------------

    def spilled(self, job: str) -> dict[str, spill.SpillRecord]:
        """The job's spilled parts, by part name."""
        return dict(self._index.get(job, {}))

    def _job_dir(self, job: str) -> Path:
        assert self.root is not None
        return self.root / job

    def _write_index(self, job: str) -> None:
        records = self._index.get(job, {})
        folder = self._job_dir(job)
        if not records:
            self._index.pop(job, None)
            shutil.rmtree(folder, ignore_errors=True)
            return
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / f".{INDEX}.part"
        data = json.dumps({"parts": {n: r.to_json() for n, r in sorted(records.items())}})
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        temp.replace(folder / INDEX)

    def recover(self) -> None:
        """Read every job's index after a start; settle what an agent stop cut off. Runs
        once the tiered backend exists (`wrap`), since only it tells which jobs are parked."""
        if self.root is None or self._backend is None or not self.root.is_dir():
            return
        self._index.clear()
        parked = set(self._backend.parked_jobs())
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            job = folder.name
            if job not in parked:  # released, or restored, while its files stayed behind
                log.warning("spill: job %s has no parked copy; its spill files are dropped", job)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            try:
                data = json.loads((folder / INDEX).read_text())
                records = {str(n): spill.SpillRecord.from_json(r) for n, r in data["parts"].items()}
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("spill: %s has no readable index; its files are dropped", folder)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            host = {p.name: p for p in self._parts(job)}
            for name in list(records):
                if name in host and host[name].exists():
                    del records[name]  # a fill finished or a spill did not: host copy wins
            self._index[job] = records
            self._write_index(job)
            keep = {Path(r.file).name for r in records.values()} | {INDEX}
            for stray in folder.iterdir() if folder.is_dir() else ():
                if stray.name not in keep:
                    stray.unlink(missing_ok=True)

    def _parts(self, job: str) -> Sequence[Path]:
        return self._backend.parked_parts(job) if self._backend is not None else ()

    # -- host memory -------------------------------------------------------------------

    def host_parts(self) -> list[spill_choice.ParkedPart]:
        """Every parked part now in host memory."""
        found: list[spill_choice.ParkedPart] = []
        if self._backend is None:
            return found
        for job in self._backend.parked_jobs():
            since = max(self._backend.parked_since(job), self._used.get(job, 0.0))
            away = self._index.get(job, {})
            for path in self._backend.parked_parts(job):
                if path.name in away:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    found.append(
                        spill_choice.ParkedPart(job, path.name, path.stat().st_size, since)
                    )
        return found

    def disk_bytes(self, job: str | None = None) -> int:
        """Parked bytes of `job` (of every job: None) in the spill directory."""
        jobs = self._index.values() if job is None else [self._index.get(job, {})]
        return sum(r.length for records in jobs for r in records.values())

    def tier_bytes(self) -> dict[str, int]:
        """Parked bytes per tier: {"dram": .., "disk": ..}."""
        return {"dram": sum(p.nbytes for p in self.host_parts()), "disk": self.disk_bytes()}

    def observe(self) -> None:
        """Refresh the per-tier gauges."""
        if self.metrics is not None and self.enabled:
            for tier, nbytes in self.tier_bytes().items():
                self.metrics.tier_bytes.labels(tier=tier).set(nbytes)

    async def make_room(
        self,
        job: str,
        nbytes: int,
        *,
        keep: frozenset[str] = frozenset(),
        shortfall: int = 0,
    ) -> None:
        """Make room in the host budget for `nbytes` more of `job` (a park about to run),
        spilling at least `shortfall` bytes besides (host memory the reserve lacks), and
        reserve them until the park settles; ResourceExhaustedError when the budget cannot
        be kept or a spill finds the disk full: then nothing was lost. Host memory short
        with nothing left to spill is the host-memory guard's to refuse."""
        if not self.enabled:
            return
        async with self.lock:
            self._reserved.pop(job, None)
            await self._make_room(job, nbytes, keep | {job}, shortfall=shortfall)
            self._reserved[job] = nbytes

    def settled(self, job: str) -> None:
        """The park of `job` ended (done or not): its reservation is over."""
        self._reserved.pop(job, None)

    @contextlib.contextmanager
    def busy(self, jobs: Sequence[str]) -> Iterator[None]:
        """While the block runs, no part of `jobs` is chosen to spill (a restore or swap
        reads their parked copies)."""
        for job in jobs:
            self._busy[job] = self._busy.get(job, 0) + 1
        try:
            yield
        finally:
            for job in jobs:
                self._busy[job] -= 1
                if not self._busy[job]:
                    del self._busy[job]

    async def _make_room(
        self,
        job: str,
        nbytes: int,
        keep: frozenset[str],
        *,
        shortfall: int = 0,
        then: str = "keeps running",
    ) -> None:
        assert self.budget is not None
        keep = keep | frozenset(self._busy)
        pending = sum(n for j, n in self._reserved.items() if j != job)
        parts = await asyncio.to_thread(self.host_parts)
        plan = spill_choice.choose(
            parts,
            incoming=nbytes,
            budget=self.budget,
            keep=keep,
            pending=pending,
            shortfall=shortfall if self.root is not None else 0,
        )
        if plan.refusal is None and plan.spill and self.root is None:
            plan = spill_choice.SpillPlan(
                refusal=f"host budget: parking {format_bytes(nbytes)} of job {job} needs "
                f"{format_bytes(plan.nbytes)} of other parked state spilled, and no spill "
                "directory is set"
            )
        if plan.refusal is not None:
            raise ResourceExhaustedError(f"{plan.refusal}; job {job} {then}")
        for part in plan.spill:
            try:
                await self._spill(part)
            except spill.SpillError as error:
                raise ResourceExhaustedError(f"{error}; job {job} {then}") from error

    async def _spill(self, part: spill_choice.ParkedPart) -> None:
        source = next(p for p in self._parts(part.job) if p.name == part.name)
        target = self._job_dir(part.job) / part.name
        started = time.perf_counter()
        record = await asyncio.to_thread(spill.write_part, source, target)
        self._index.setdefault(part.job, {})[part.name] = record
        try:
            await asyncio.to_thread(self._write_index, part.job)
        except OSError as error:  # the index did not land: the part stays in host memory
            del self._index[part.job][part.name]
            target.unlink(missing_ok=True)
            raise spill.failure(error, "index write", target.parent / INDEX) from error
        source.unlink()  # only now: the index says where the bytes are
        self._observe(part.job, "spill", part.nbytes, time.perf_counter() - started)
        log.info("spill: %s of job %s to %s", part.name, part.job, target)

    async def prefetch(
        self, job: str, *, host_free: Callable[[], int] = lambda: 1 << 62, reserve: int = 0
    ) -> int:
        """Fill `job` ahead of its restore (it is the next waiter, its holder runs): its
        spilled parts back into host memory, verified, other jobs' parts spilled first
        (least recently used) where the budget or the reserve needs it; bytes read. The job
        then counts as just used, so it is the last to spill again.

        ResourceExhaustedError when the budget cannot be kept or host memory would fall
        below `reserve` (nothing of `job` moved: its restore fills from disk as before);
        SpillFileError when a spill file is missing or damaged (the restore fails so too)."""
        if not self.disk_bytes(job):
            return 0
        with self.busy([job]):
            async with self.lock:
                records = dict(self._index.get(job, {}))
                total = sum(r.length for r in records.values())
                try:
                    await self._make_room(
                        job,
                        total,
                        frozenset({job}),
                        shortfall=total + reserve - host_free(),
                        then="stays on disk",
                    )
                except ResourceExhaustedError as error:
                    raise ResourceExhaustedError(f"prefetch of job {job}: {error}") from error
                if host_free() - total < reserve:
                    raise ResourceExhaustedError(
                        f"prefetch of job {job}: {format_bytes(total)} would leave host "
                        f"memory below the reserve of {format_bytes(reserve)}; its restore "
                        "reads it from disk"
                    )
                await self._fill_parts(job, records)
        self._used[job] = time.time()
        return total

    async def fill(self, job: str, *, keep: frozenset[str] = frozenset()) -> int:
        """Bring every spilled part of `job` back into host memory, verified; bytes read.

        SpillFileError (a BackendError naming the file) when a spill file is missing, torn
        or damaged: the job's restore fails with that reason."""
        records = self._index.get(job)
        if not records:
            return 0
        async with self.lock:
            records = dict(self._index.get(job, {}))
            total = sum(r.length for r in records.values())
            try:
                await self._make_room(job, total, keep | {job})
            except ResourceExhaustedError as error:
                raise BackendError(f"fill of job {job}: {error}") from error
            await self._fill_parts(job, records)
            return total

    async def _fill_parts(self, job: str, records: dict[str, spill.SpillRecord]) -> None:
        """Read `records` of `job` back into its parked copy, one part at a time, each
        dropped from the index (and its file removed) once it is whole in host memory."""
        targets = {p.name: p for p in self._parts(job)}
        for name, record in sorted(records.items()):
            started = time.perf_counter()
            if name not in targets:
                raise spill.SpillFileError(f"spill file {record.file}: no parked part {name}")
            await asyncio.to_thread(spill.read_part, record, targets[name])
            del self._index[job][name]
            await asyncio.to_thread(self._write_index, job)
            await asyncio.to_thread(_unlink, record.file)  # in host memory again
            self._observe(job, "fill", record.length, time.perf_counter() - started)

    def forget(self, job: str) -> int:
        """Drop the job's spill files (its parked copy is released); bytes freed."""
        records = self._index.pop(job, {})
        self._used.pop(job, None)
        if self.root is not None:
            shutil.rmtree(self._job_dir(job), ignore_errors=True)
        self._reserved.pop(job, None)
        return sum(r.length for r in records.values())

    def _observe(self, job: str, direction: str, nbytes: int, seconds: float) -> None:
        tier_moves.tell(job, direction, nbytes, seconds)
        if self.metrics is None:
            return
        histogram = (
            self.metrics.spill_seconds if direction == "spill" else self.metrics.fill_seconds
        )
        histogram.observe(seconds)
        self.metrics.tier_moved_bytes.labels(direction=direction).inc(nbytes)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class TieredBackend:
    """A backend that `SupportsSpill`, behind the disk tier: a restore fills the job's
    spilled parts first, a release drops them, a swap whose incoming job is spilled runs
    its halves one after the other when both would not fit the host budget at once."""

    def __init__(self, inner: Backend, tiering: Tiering) -> None:
        self.inner = inner
        self.name = inner.name
        """The wrapped backend's name."""
        self.tiering = tiering

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)

    async def probe(self) -> ProbeResult:
        return await self.inner.probe()

    async def devices(self) -> Sequence[DeviceUsage]:
        return await self.inner.devices()

    async def device_bytes(self, job: JobHandle) -> int:
        return await self.inner.device_bytes(job)

    async def state(self, job: JobHandle) -> BackendState:
        seen = await self.inner.state(job)
        if seen is BackendState.RUNNING:
            self.tiering.forget(job.job)  # no parked copy: spilled parts are stale
        return seen

    async def snapshot(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        try:
            return await self.inner.snapshot(job, deadline=deadline)
        finally:
            self.tiering.settled(job.job)

    async def restore(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        with self.tiering.busy([job.job]):
            await self.tiering.fill(job.job)
            return await self.inner.restore(job, deadline=deadline)

    async def release(self, job: JobHandle) -> int:
        async with self.tiering.lock:  # no spill of this job is under way meanwhile
            freed = await self.inner.release(job)
            return freed + self.tiering.forget(job.job)

    async def swap(
        self,
        outgoing: Sequence[JobHandle],
        incoming: JobHandle | None,
        *,
        headroom_bytes: int,
        deadline: float,
    ) -> SwapOutcome:
        """The inner swap; an incoming job with spilled parts is filled first, beside the
        outgoing jobs' bytes when the budget holds both, else after they are parked (and
        may be spilled): then the halves run one after the other, all or nothing."""
        assert isinstance(self.inner, SupportsSwap)
        leaving = frozenset(j.job for j in outgoing)
        with contextlib.ExitStack() as stack:
            if incoming is not None:
                stack.enter_context(self.tiering.busy([incoming.job]))
            return await self._swap(outgoing, incoming, leaving, headroom_bytes, deadline)

    async def _swap(
        self,
        outgoing: Sequence[JobHandle],
        incoming: JobHandle | None,
        leaving: frozenset[str],
        headroom_bytes: int,
        deadline: float,
    ) -> SwapOutcome:
        assert isinstance(self.inner, SupportsSwap)
        try:
            if incoming is None or not self.tiering.spilled(incoming.job):
                return await self.inner.swap(
                    outgoing, incoming, headroom_bytes=headroom_bytes, deadline=deadline
                )
            try:
                await self.tiering.fill(incoming.job, keep=leaving)
            except spill.SpillFileError as error:
                raise SwapError(incoming.job, "restore", error) from error
            except BackendError:
                return await self._one_after_the_other(outgoing, incoming, deadline)
            return await self.inner.swap(
                outgoing, incoming, headroom_bytes=headroom_bytes, deadline=deadline
            )
        finally:
            for job in leaving:
                self.tiering.settled(job)

    async def _one_after_the_other(
        self, outgoing: Sequence[JobHandle], incoming: JobHandle, deadline: float
    ) -> SwapOutcome:
        assert isinstance(self.inner, SupportsSwap)
        parked = await self.inner.swap(outgoing, None, headroom_bytes=0, deadline=deadline)
        for job in outgoing:
            self.tiering.settled(job.job)
        try:
            await self.tiering.fill(incoming.job)
            restored = await self.inner.restore(incoming, deadline=deadline)
        except BackendError as error:
            for job in outgoing:  # all or nothing: the outgoing jobs run on
                try:
                    await self.restore(job, deadline=deadline + 30)
                except BackendError as undo:
                    log.error("job %s: undoing its snapshot failed: %s", job.job, undo)
            raise SwapError(incoming.job, "restore", error) from error
        return SwapOutcome(outgoing=parked.outgoing, incoming=restored, overlapped=False)
