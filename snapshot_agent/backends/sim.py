"""The `sim` backend: emulated device memory in shared-memory files, really moved.

A job allocates emulated device memory with `rlslice.client.sim` (one shared-memory file
per buffer, see `_simfs`). A snapshot SIGSTOPs every verified process of the job, copies
each buffer into a parked copy (host memory: tmpfs under the node folder, private to the
agent), writes a manifest, then frees the device by truncating the buffer files to zero.
The job's mappings stay valid: a restore grows the files back, copies the bytes in, removes
the manifest and SIGCONTs the processes, which find their memory as they left it.

Copies are paced by the node's link and each move costs `overhead_seconds` more, to model
PCIe and driver costs. The link is full duplex, as PCIe is: copies out (device to host) and
in (host to device) are paced separately, at `out_gbps` and `in_gbps` (both `rate_gbps`
unless set), optionally under a shared cap `link_gbps` for both directions together;
concurrent copies in one direction share its rate. The manifest is the backend's truth
after an agent restart: present means PARKED, absent means RUNNING (an interrupted move is
settled on the spot).

`swap` is one node's half of an overlapped switch (see `swap`): the outgoing jobs' buffers
are copied out and freed chunk by chunk, from their ends, and the incoming job's buffers
grow chunk by chunk as that memory frees, never above capacity minus the headroom while
bytes are still leaving. A journal written before anything is freed lets an interrupted
swap (an agent killed half-way) give every freed chunk back from the parked copy.

Parts (issue 26): a buffer belongs to the part its job allocated it with (`alloc(tag=)`).
A partial snapshot (the `offload_tags` option present) copies only the buffers of those
tags, frees the buffers of the half's `discard_tags` without a copy, and leaves every other
buffer on the device (its processes are stopped all the same: the job is parked). The
manifest lists both; a restore copies the parked buffers back and grows the discarded ones
again, zero-filled, for the job to rebuild. A partial move is never overlapped (`swap`
runs its halves one after the other).

The paced copies live in `_simcopy`, the swap's copies in `_simswap` and its async side in
`_simswapping`.

Options are validated models: `SimOptions` at agent level (from `SimSettings`): devices,
capacity_bytes, rate_gbps, out_gbps, in_gbps, link_gbps, chunk_bytes, overhead_seconds,
root; `SimJobOptions` per group, through the job's options: the rates and
overhead_seconds. A malformed one is refused with one line naming it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rlslice import env
from rlslice.config import OFFLOAD_TAGS_OPTION
from rlslice.snapshot_agent.backends import _freeze, _options, _simfs, _simswap
from rlslice.snapshot_agent.backends._simcopy import (
    CHUNK,
    Link,
    Pacer,
    copy_paced,
    discard,
    in_thread,
)
from rlslice.snapshot_agent.backends._simswapping import SwappingMixin
from rlslice.snapshot_agent.backends.base import (
    BackendBase,
    BackendContext,
    BackendError,
    BackendState,
    DeviceMemoryError,
    DeviceUsage,
    JobHandle,
    MoveOutcome,
    ProbeResult,
)

GiB = 1 << 30
DEFAULT_ROOT = env.DEFAULT_SIM_ROOT


Rate = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""GB/s, seconds or a count: a finite number >= 0."""


class SimJobOptions(BaseModel):
    """What a group may set for its jobs' moves (None: the agent's own)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rate_gbps: Rate | None = None
    """Both directions' copy rate, GB/s; 0 means unlimited."""
    out_gbps: Rate | None = None
    """Device-to-host copy rate, GB/s (`rate_gbps` unless set)."""
    in_gbps: Rate | None = None
    """Host-to-device copy rate, GB/s (`rate_gbps` unless set)."""
    link_gbps: Rate | None = None
    """A cap on both directions together, GB/s; 0 means none."""
    overhead_seconds: Rate | None = None
    """Fixed cost added to every move."""


class SimOptions(SimJobOptions):
    """The `sim` backend's agent-level options (from `SimSettings`)."""

    devices: Rate = 1
    """Emulated devices on the node (at least one)."""
    capacity_bytes: Rate = 16 * GiB
    """Memory of each emulated device."""
    chunk_bytes: Rate = CHUNK
    """Bytes copied per step (at least 4096)."""
    root: str = ""
    """Where the node folders live (empty: the default root)."""


class SimBackend(SwappingMixin, BackendBase):
    """Emulated devices with a capacity and a copy rate; jobs really frozen and copied."""

    name: ClassVar[str] = "sim"
    splits_parts: ClassVar[bool] = True
    """Takes partial snapshots (`OFFLOAD_TAGS_OPTION`)."""

    def __init__(self, context: BackendContext) -> None:
        options = _options.parse(SimOptions, context.options)
        self._root = Path(options.root or DEFAULT_ROOT)
        self.node_dir = self._root / context.node
        count = int(options.devices)
        capacity = int(options.capacity_bytes)
        self._rate = options.rate_gbps or 0.0
        self._out = self._rate if options.out_gbps is None else options.out_gbps
        self._in = self._rate if options.in_gbps is None else options.in_gbps
        self._shared = options.link_gbps or 0.0
        self._chunk = max(4096, int(options.chunk_bytes))
        self._overhead = options.overhead_seconds or 0.0
        self._links: dict[tuple[float, float, float], Link] = {}
        self._links_lock = threading.Lock()
        for leftover in (self.node_dir / _simfs.PARKED_DIR).glob(".trash-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        self.devices_table = [
            _simfs.SimFsDevice(i, capacity, f"sim{i}") for i in range(max(1, count))
        ]
        _simfs.write_devices(self.node_dir, self.devices_table)

    # -- reporting ---------------------------------------------------------------------

    async def probe(self) -> ProbeResult:
        if not os.access(self.node_dir, os.W_OK):
            return ProbeResult(False, f"{self.node_dir} is not writable")
        total = self.devices_table[0].total_bytes
        rate = (
            f"link {self._out:g} GB/s out, {self._in:g} GB/s in"
            + (f", {self._shared:g} GB/s shared" if self._shared > 0 else "")
            if self._out > 0 or self._in > 0 or self._shared > 0
            else "unlimited rate"
        )
        return ProbeResult(
            True,
            f"{len(self.devices_table)} emulated device(s) of {total / GiB:.2f} GiB, {rate}",
        )

    async def devices(self) -> Sequence[DeviceUsage]:
        # Metadata reads (a stat per buffer file) run inline: a hop to the thread pool
        # costs more than they do, and Status and every move ask for them.
        used = _simfs.used_bytes(self.node_dir)
        return [
            DeviceUsage(d.index, used.get(d.index, 0), d.total_bytes, d.name)
            for d in self.devices_table
        ]

    async def device_bytes(self, job: JobHandle) -> int:
        """The job's bytes on the devices; for a partial snapshot's handle, those of the
        parts it copies (what the agent's host-memory guard asks room for)."""
        buffers = _simfs.job_buffers(self.node_dir, job.job)  # inline, as `devices`
        return sum(b.size for b in _chosen(job, buffers)[0])

    def _manifest(self, job: str) -> dict[str, object] | None:
        try:
            data = json.loads((_simfs.parked_dir(self.node_dir, job) / _simfs.MANIFEST).read_text())
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    # -- the disk tier (SupportsSpill) -------------------------------------------------

    def parked_jobs(self) -> Sequence[str]:
        folder = self.node_dir / _simfs.PARKED_DIR
        try:
            names = [e.name for e in os.scandir(folder) if e.is_dir() and e.name[0] != "."]
        except FileNotFoundError:
            return []
        return sorted(n for n in names if (folder / n / _simfs.MANIFEST).exists())

    def parked_parts(self, job: str) -> Sequence[Path]:
        manifest = self._manifest(job)
        entries = manifest.get("buffers") if manifest is not None else None
        if not isinstance(entries, list):
            return []
        park = _simfs.parked_dir(self.node_dir, job)
        return [park / (str(entry["name"]) + ".bin") for entry in entries if entry.get("size")]

    def parked_since(self, job: str) -> float:
        try:
            return (_simfs.parked_dir(self.node_dir, job) / _simfs.MANIFEST).stat().st_mtime
        except FileNotFoundError:
            return 0.0

    async def state(self, job: JobHandle) -> BackendState:
        if self._manifest(job.job) is not None:
            # Parked: device memory a restore had grown before it was cut off goes back
            # (the parked copy is the truth), and a committed swap's journal is spent.
            (_simfs.parked_dir(self.node_dir, job.job) / _simswap.JOURNAL).unlink(missing_ok=True)
            moved = _moved_names(self._manifest(job.job))
            for buffer in _simfs.job_buffers(self.node_dir, job.job):
                if buffer.size and (moved is None or buffer.path.name in moved):
                    os.truncate(buffer.path, 0)
            return BackendState.PARKED
        # No manifest: any move was interrupted before it committed. Settle it: a swap
        # cut off half-way gets its freed chunks back from the parked copy; then drop a
        # half-written parked copy and resume processes a snapshot had stopped.
        stopped = tuple(pid for pid in job.pids if _freeze.stopped(pid))
        if _simswap.interrupted(self.node_dir, job.job):
            await asyncio.to_thread(_simswap.undo_snapshot, self.node_dir, job.job, stopped)
        shutil.rmtree(_simfs.parked_dir(self.node_dir, job.job), ignore_errors=True)
        _freeze.resume(stopped)
        return BackendState.RUNNING

    # -- moves -------------------------------------------------------------------------

    def _rates(self, job: JobHandle) -> tuple[Link, float]:
        """The link the job's copies share (per rates: a group may set its own) and the
        fixed cost of each move."""
        asked = _options.parse(SimJobOptions, job.options)
        rate = asked.rate_gbps
        out = asked.out_gbps if asked.out_gbps is not None else rate
        into = asked.in_gbps if asked.in_gbps is not None else rate
        out = self._out if out is None else out
        into = self._in if into is None else into
        shared = self._shared if asked.link_gbps is None else asked.link_gbps
        with self._links_lock:
            link = self._links.setdefault((out, into, shared), Link(out, into, shared))
        overhead = self._overhead if asked.overhead_seconds is None else asked.overhead_seconds
        return link, overhead

    async def snapshot(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        link, overhead = self._rates(job)
        started = time.perf_counter()
        try:
            stopped = await _freeze.stop(job.pids, deadline=deadline)
        except TimeoutError as error:
            _freeze.resume(job.pids)
            raise BackendError(f"snapshot of job {job.job}: {error}") from None
        park = _simfs.parked_dir(self.node_dir, job.job)
        pacer = Pacer(link, "out", deadline, chunk=self._chunk)
        try:
            buffers, dropped = _chosen(job, _simfs.job_buffers(self.node_dir, job.job))
            moved = await in_thread(lambda: self._save(park, buffers, pacer, dropped), pacer)
        except BaseException as error:
            if self._manifest(job.job) is None:  # not committed: roll back
                shutil.rmtree(park, ignore_errors=True)
                _freeze.resume(stopped)
            if isinstance(error, OSError | TimeoutError):
                raise BackendError(f"snapshot of job {job.job}: {error}") from error
            raise
        await asyncio.sleep(overhead)
        return MoveOutcome(moved, time.perf_counter() - started)

    def _save(
        self,
        park: Path,
        buffers: list[_simfs.BufferFile],
        pacer: Pacer,
        dropped: list[_simfs.BufferFile] | None = None,
    ) -> int:
        """Copy `buffers` to `park`, commit the manifest, free them; `dropped` (a partial
        snapshot's discarded buffers; None: a whole one) are freed without a copy."""
        shutil.rmtree(park, ignore_errors=True)
        park.mkdir(parents=True, mode=0o700)
        done = 0
        entries = []
        for buffer in buffers:
            target = park / (buffer.path.name + ".bin")
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if buffer.size:
                    done = copy_paced(buffer.path, fd, buffer.size, pacer, done)
            finally:
                os.close(fd)
            entries.append({"name": buffer.path.name, "device": buffer.device, "size": buffer.size})
        # The manifest commits the snapshot; only then is device memory freed.
        pacer.check()
        temp = park / (_simfs.MANIFEST + ".part")
        manifest: dict[str, object] = {"buffers": entries}
        if dropped is not None:
            manifest["discarded"] = [
                {"name": b.path.name, "device": b.device, "size": b.size} for b in dropped
            ]
        temp.write_text(json.dumps(manifest))
        temp.replace(park / _simfs.MANIFEST)
        for buffer in [*buffers, *(dropped or ())]:
            os.truncate(buffer.path, 0)
        return done

    async def restore(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        link, overhead = self._rates(job)
        started = time.perf_counter()
        manifest = self._manifest(job.job)
        if manifest is None:
            raise BackendError(f"restore of job {job.job}: no parked copy on this node")
        entries = manifest.get("buffers")
        if not isinstance(entries, list):
            raise BackendError(f"restore of job {job.job}: damaged manifest")
        dropped = manifest.get("discarded", [])
        if not isinstance(dropped, list):
            raise BackendError(f"restore of job {job.job}: damaged manifest")
        pacer = Pacer(link, "in", deadline, chunk=self._chunk)
        try:
            moved = await in_thread(lambda: self._load(job.job, entries, pacer, dropped), pacer)
        except DeviceMemoryError as error:
            raise DeviceMemoryError(f"restore of job {job.job}: {error}") from error
        except (OSError, TimeoutError, KeyError, ValueError) as error:
            raise BackendError(f"restore of job {job.job}: {error}") from error
        await asyncio.sleep(overhead)
        # The parked copy is gone from the manifest's point of view: resume, then clean up
        # (freeing the copy's pages is the kernel's work, done off the switch's path).
        _freeze.resume(job.pids)
        discard(_simfs.parked_dir(self.node_dir, job.job))
        return MoveOutcome(moved, time.perf_counter() - started)

    def _load(
        self,
        job: str,
        entries: list[dict[str, object]],
        pacer: Pacer,
        dropped: list[dict[str, object]] | None = None,
    ) -> int:
        """Grow the buffers of `entries` and `dropped` (discarded: zero-filled) back, copy
        the parked bytes of `entries` in, commit; the bytes copied."""
        folder = self.node_dir / _simfs.JOBS_DIR / job
        park = _simfs.parked_dir(self.node_dir, job)
        wanted: dict[int, list[tuple[Path, int]]] = {}
        grow: dict[int, list[tuple[Path, int]]] = {}
        listed = [(e, True) for e in entries] + [(e, False) for e in dropped or ()]
        for entry, copied in listed:
            path = folder / str(entry["name"])
            size = int(str(entry["size"]))
            device = int(str(entry["device"]))
            grow.setdefault(device, []).append((path, size))
            if copied:
                wanted.setdefault(device, []).append((path, size))
        grown: list[Path] = []
        try:
            for index, items in sorted(grow.items()):
                self._take_capacity(index, items, grown, pacer.deadline)
            done = 0
            for items in wanted.values():
                for path, size in items:
                    if not size:
                        continue
                    fd = os.open(path, os.O_WRONLY)
                    try:
                        done = copy_paced(park / (path.name + ".bin"), fd, size, pacer, done)
                    finally:
                        os.close(fd)
            pacer.check()
        except BaseException:
            for path in grown:  # give the device memory back; the job stays parked
                os.truncate(path, 0)
            raise
        # Removing the manifest commits the restore.
        (park / _simfs.MANIFEST).unlink()
        return done

    def _take_capacity(
        self, index: int, items: list[tuple[Path, int]], grown: list[Path], deadline: float
    ) -> None:
        total = next((d.total_bytes for d in self.devices_table if d.index == index), 0)
        with _simfs.device_lock(self.node_dir, index, deadline):
            used = _simfs.used_bytes(self.node_dir).get(index, 0)
            needed = sum(max(0, size - _size_of(path)) for path, size in items)
            if used + needed > total:
                raise DeviceMemoryError(
                    f"device {index} out of memory: needs {needed} bytes, "
                    f"{max(0, total - used)} of {total} free"
                )
            for path, size in items:
                if not path.exists():
                    raise OSError(f"buffer {path.name} is gone")
                os.truncate(path, size)
                grown.append(path)

    async def release(self, job: JobHandle) -> int:
        park = _simfs.parked_dir(self.node_dir, job.job)
        freed = sum(p.stat().st_size for p in park.glob("*.bin")) if park.exists() else 0
        shutil.rmtree(park, ignore_errors=True)
        if not job.pids:
            # No process left: its device memory is garbage, as on a GPU after exit.
            shutil.rmtree(self.node_dir / _simfs.JOBS_DIR / job.job, ignore_errors=True)
        else:
            # Let go while parked (the job unregistered): its device state is gone, but its
            # processes must not stay frozen for ever, or they could never exit.
            _freeze.resume(job.pids)
        return freed


def _chosen(
    job: JobHandle, buffers: list[_simfs.BufferFile]
) -> tuple[list[_simfs.BufferFile], list[_simfs.BufferFile] | None]:
    """(the buffers to copy, those to free without a copy): every buffer and None for a
    whole snapshot; for a partial one (`OFFLOAD_TAGS_OPTION` given) those of its offload
    tags and those of its discard tags (a tag in both is copied)."""
    if OFFLOAD_TAGS_OPTION not in job.options:
        return buffers, None
    raw = job.options[OFFLOAD_TAGS_OPTION].split(",")
    offload = {_simfs.clean_tag(t.strip()) for t in raw if t.strip()}
    drop = {_simfs.clean_tag(t) for t in job.discard_tags} - offload
    return (
        [b for b in buffers if _simfs.buffer_tag(b.path) in offload],
        [b for b in buffers if _simfs.buffer_tag(b.path) in drop],
    )


def _moved_names(manifest: dict[str, object] | None) -> set[str] | None:
    """The buffers a partial manifest moved (parked or discarded); None for a whole one."""
    if manifest is None or "discarded" not in manifest:
        return None
    lists = [manifest.get("buffers"), manifest.get("discarded")]
    return {str(e["name"]) for entries in lists if isinstance(entries, list) for e in entries}


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
