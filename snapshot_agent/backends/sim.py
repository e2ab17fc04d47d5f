"""The `sim` backend: emulated device memory in shared-memory files, really moved.

A job allocates emulated device memory with `rlslice.client.sim` (one shared-memory file
per buffer, see `_simfs`). A snapshot SIGSTOPs every verified process of the job, copies
each buffer into a parked copy (host memory: tmpfs under the node folder, private to the
agent), writes a manifest, then frees the device by truncating the buffer files to zero.
The job's mappings stay valid: a restore grows the files back, copies the bytes in, removes
the manifest and SIGCONTs the processes, which find their memory as they left it.

Copies are paced to `rate_gbps` and each move costs `overhead_seconds` more, to model PCIe
and driver costs. The manifest is the backend's truth after an agent restart: present
means PARKED, absent means RUNNING (an interrupted move is settled on the spot).

Options (agent level, from `SimSettings`; `rate_gbps` and `overhead_seconds` may also come
per group through the job's options): devices, capacity_bytes, rate_gbps,
overhead_seconds, root.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from rlslice.snapshot_agent.backends import _freeze, _simfs
from rlslice.snapshot_agent.backends.base import (
    BackendContext,
    BackendError,
    BackendState,
    DeviceMemoryError,
    DeviceUsage,
    JobHandle,
    MoveOutcome,
    OptionsError,
    ProbeResult,
)

GiB = 1 << 30
_CHUNK = 64 << 20
DEFAULT_ROOT = "/dev/shm/rlslice-sim"


def _float(options: Mapping[str, str], key: str, default: float) -> float:
    text = options.get(key)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise OptionsError(f"{key}: {text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise OptionsError(f"{key}: must be a finite number >= 0, got {text}")
    return value


class _Pacer:
    """Sleeps so that `done` bytes take at least `done / rate` seconds since the start;
    stops the copy past the deadline or when the waiting coroutine is cancelled."""

    def __init__(self, rate_gbps: float, deadline: float) -> None:
        self._rate = rate_gbps * 1e9
        self.deadline = deadline
        self._start = time.perf_counter()
        self.cancelled = threading.Event()

    def check(self) -> None:
        if self.cancelled.is_set():
            raise TimeoutError("the move was cancelled")
        if time.time() > self.deadline:
            raise TimeoutError("the copy ran past the deadline")

    def after(self, done: int) -> None:
        self.check()
        if self._rate > 0:
            wait = done / self._rate - (time.perf_counter() - self._start)
            if wait > 0:
                time.sleep(wait)


async def _in_thread(fn: Callable[[], int], pacer: _Pacer) -> int:
    """Run a copy in a thread. A cancelled caller stops the copy and waits for the thread,
    so nothing touches the job's files once this returns or raises."""
    future = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        pacer.cancelled.set()
        await asyncio.wait([future])
        raise


def _copy(source: Path, target_fd: int, size: int, pacer: _Pacer, done: int) -> int:
    """Copy `size` bytes of `source` into `target_fd` from offset 0; return bytes done.

    copy_file_range keeps the bytes in the kernel: no mapping of the job's memory here."""
    source_fd = os.open(source, os.O_RDONLY)
    try:
        offset = 0
        while offset < size:
            step = min(_CHUNK, size - offset)
            end = offset + step
            while offset < end:
                copied = os.copy_file_range(source_fd, target_fd, end - offset, offset, offset)
                if copied == 0:
                    raise OSError(f"{source.name}: shorter than {size} bytes")
                offset += copied
            done += step
            pacer.after(done)
    finally:
        os.close(source_fd)
    return done


def _discard(folder: Path) -> None:
    """Remove `folder` off the caller's path: rename it aside now, free its pages later."""
    if not folder.exists():
        return
    trash = folder.with_name(f".trash-{folder.name}-{time.monotonic_ns()}")
    try:
        folder.rename(trash)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return
    threading.Thread(target=shutil.rmtree, args=(trash, True), daemon=True).start()


class SimBackend:
    """Emulated devices with a capacity and a copy rate; jobs really frozen and copied."""

    name: ClassVar[str] = "sim"

    def __init__(self, context: BackendContext) -> None:
        options = context.options
        self._root = Path(options.get("root") or DEFAULT_ROOT)
        self.node_dir = self._root / context.node
        count = int(_float(options, "devices", 1))
        capacity = int(_float(options, "capacity_bytes", 16 * GiB))
        self._rate = _float(options, "rate_gbps", 0.0)
        self._overhead = _float(options, "overhead_seconds", 0.0)
        for leftover in (self.node_dir / _simfs.PARKED_DIR).glob(".trash-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        self.devices_table = [
            _simfs.SimDevice(i, capacity, f"sim{i}") for i in range(max(1, count))
        ]
        _simfs.write_devices(self.node_dir, self.devices_table)

    # -- reporting ---------------------------------------------------------------------

    async def probe(self) -> ProbeResult:
        if not os.access(self.node_dir, os.W_OK):
            return ProbeResult(False, f"{self.node_dir} is not writable")
        total = self.devices_table[0].total_bytes
        rate = f"{self._rate:g} GB/s" if self._rate > 0 else "unlimited rate"
        return ProbeResult(
            True,
            f"{len(self.devices_table)} emulated device(s) of {total / GiB:.2f} GiB, {rate}",
        )

    async def devices(self) -> Sequence[DeviceUsage]:
        used = await asyncio.to_thread(_simfs.used_bytes, self.node_dir)
        return [
            DeviceUsage(d.index, used.get(d.index, 0), d.total_bytes, d.name)
            for d in self.devices_table
        ]

    async def device_bytes(self, job: JobHandle) -> int:
        buffers = await asyncio.to_thread(_simfs.job_buffers, self.node_dir, job.job)
        return sum(b.size for b in buffers)

    def _manifest(self, job: str) -> dict[str, object] | None:
        try:
            data = json.loads((_simfs.parked_dir(self.node_dir, job) / _simfs.MANIFEST).read_text())
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    async def state(self, job: JobHandle) -> BackendState:
        if self._manifest(job.job) is not None:
            return BackendState.PARKED
        # No manifest: any move was interrupted before it committed. Settle it: drop a
        # half-written parked copy and resume processes a snapshot had stopped.
        shutil.rmtree(_simfs.parked_dir(self.node_dir, job.job), ignore_errors=True)
        _freeze.resume(pid for pid in job.pids if _freeze.stopped(pid))
        return BackendState.RUNNING

    # -- moves -------------------------------------------------------------------------

    def _rates(self, job: JobHandle) -> tuple[float, float]:
        return (
            _float(job.options, "rate_gbps", self._rate),
            _float(job.options, "overhead_seconds", self._overhead),
        )

    async def snapshot(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        rate, overhead = self._rates(job)
        started = time.perf_counter()
        try:
            stopped = await _freeze.stop(job.pids, deadline=deadline)
        except TimeoutError as error:
            _freeze.resume(job.pids)
            raise BackendError(f"snapshot of job {job.job}: {error}") from None
        park = _simfs.parked_dir(self.node_dir, job.job)
        pacer = _Pacer(rate, deadline)
        try:
            buffers = _simfs.job_buffers(self.node_dir, job.job)
            moved = await _in_thread(lambda: self._save(park, buffers, pacer), pacer)
        except BaseException as error:
            if self._manifest(job.job) is None:  # not committed: roll back
                shutil.rmtree(park, ignore_errors=True)
                _freeze.resume(stopped)
            if isinstance(error, OSError | TimeoutError):
                raise BackendError(f"snapshot of job {job.job}: {error}") from error
            raise
        await asyncio.sleep(overhead)
        return MoveOutcome(moved, time.perf_counter() - started)

    def _save(self, park: Path, buffers: list[_simfs.BufferFile], pacer: _Pacer) -> int:
        shutil.rmtree(park, ignore_errors=True)
        park.mkdir(parents=True, mode=0o700)
        done = 0
        entries = []
        for buffer in buffers:
            target = park / (buffer.path.name + ".bin")
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if buffer.size:
                    done = _copy(buffer.path, fd, buffer.size, pacer, done)
            finally:
                os.close(fd)
            entries.append({"name": buffer.path.name, "device": buffer.device, "size": buffer.size})
        # The manifest commits the snapshot; only then is device memory freed.
        pacer.check()
        temp = park / (_simfs.MANIFEST + ".part")
        temp.write_text(json.dumps({"buffers": entries}))
        temp.replace(park / _simfs.MANIFEST)
        for buffer in buffers:
            os.truncate(buffer.path, 0)
        return done

    async def restore(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        rate, overhead = self._rates(job)
        started = time.perf_counter()
        manifest = self._manifest(job.job)
        if manifest is None:
            raise BackendError(f"restore of job {job.job}: no parked copy on this node")
        entries = manifest.get("buffers")
        if not isinstance(entries, list):
            raise BackendError(f"restore of job {job.job}: damaged manifest")
        pacer = _Pacer(rate, deadline)
        try:
            moved = await _in_thread(lambda: self._load(job.job, entries, pacer), pacer)
        except DeviceMemoryError as error:
            raise DeviceMemoryError(f"restore of job {job.job}: {error}") from error
        except (OSError, TimeoutError, KeyError, ValueError) as error:
            raise BackendError(f"restore of job {job.job}: {error}") from error
        await asyncio.sleep(overhead)
        # The parked copy is gone from the manifest's point of view: resume, then clean up
        # (freeing the copy's pages is the kernel's work, done off the switch's path).
        _freeze.resume(job.pids)
        _discard(_simfs.parked_dir(self.node_dir, job.job))
        return MoveOutcome(moved, time.perf_counter() - started)

    def _load(self, job: str, entries: list[dict[str, object]], pacer: _Pacer) -> int:
        folder = self.node_dir / _simfs.JOBS_DIR / job
        park = _simfs.parked_dir(self.node_dir, job)
        wanted: dict[int, list[tuple[Path, int]]] = {}
        for entry in entries:
            path = folder / str(entry["name"])
            size = int(str(entry["size"]))
            wanted.setdefault(int(str(entry["device"])), []).append((path, size))
        grown: list[Path] = []
        try:
            for index, items in sorted(wanted.items()):
                self._take_capacity(index, items, grown, pacer.deadline)
            done = 0
            for items in wanted.values():
                for path, size in items:
                    if not size:
                        continue
                    fd = os.open(path, os.O_WRONLY)
                    try:
                        done = _copy(park / (path.name + ".bin"), fd, size, pacer, done)
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


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
