"""The `sim` backend's overlapped switch on one node: the copies, run in worker threads.

An outgoing job's buffers are copied out from their ends, one chunk at a time, and each
chunk is freed (the buffer file truncated) once its copy is done, so device memory leaves
as the bytes do. The incoming job's buffers grow one chunk at a time, each chunk admitted
only while the device stays under its capacity minus the headroom (plain capacity once
every outgoing job is out), then filled from its parked copy. `Admission` tells a waiting
restore that memory was freed (a condition, never a poll).

A journal (the outgoing job's buffers and sizes) is written before the first chunk is
freed: a buffer file shorter than its journalled size has the missing tail in the parked
copy, so `undo_snapshot` (a failed half, or an agent restart half-way) puts every byte
back. The manifest commits a snapshot as in the plain path; removing the incoming job's
manifest commits its restore, which the caller does only once every half succeeded.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from rlslice.snapshot_agent.backends import _freeze, _simfs
from rlslice.snapshot_agent.backends.base import DeviceMemoryError

JOURNAL = "journal.json"


class Admission:
    """Device memory freed by the outgoing halves, told to the incoming half."""

    def __init__(self, pending: int, abort: threading.Event) -> None:
        self._cond = threading.Condition()
        self._pending = pending
        self._generation = 0
        self.abort = abort
        self.overlapped = False
        """Set when incoming bytes were admitted while outgoing ones were still leaving."""

    @property
    def pending(self) -> int:
        """Outgoing halves still running."""
        return self._pending

    @property
    def generation(self) -> int:
        """Raised at every free: read it before a capacity check, wait on it after."""
        return self._generation

    def freed(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def finished(self) -> None:
        with self._cond:
            self._pending -= 1
            self._generation += 1
            self._cond.notify_all()

    def stop(self) -> None:
        """A half failed: every other half stops at its next chunk."""
        self.abort.set()
        self.freed()

    def wait(self, seen: int, deadline: float) -> None:
        """Until memory is freed after generation `seen`; raises past `deadline` or on abort."""
        with self._cond:
            while self._generation == seen and not self.abort.is_set():
                left = deadline - time.time()
                if left <= 0:
                    raise TimeoutError("waited past the deadline for device memory to free")
                self._cond.wait(left)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    temp = path.with_name(path.name + ".part")
    temp.write_text(json.dumps(data))
    temp.replace(path)


def save_freeing(
    node_dir: Path,
    job: str,
    buffers: list[_simfs.BufferFile],
    pacer: Any,
    admission: Admission,
) -> int:
    """Copy `job`'s buffers out, freeing each chunk once copied; commit with the manifest.
    Bytes copied. On failure the caller runs `undo_snapshot`."""
    try:
        park = _simfs.parked_dir(node_dir, job)
        shutil.rmtree(park, ignore_errors=True)
        park.mkdir(parents=True, mode=0o700)
        entries = [{"name": b.path.name, "device": b.device, "size": b.size} for b in buffers]
        _write_json(park / JOURNAL, {"buffers": entries})
        done = 0
        for buffer in buffers:
            target = os.open(park / (buffer.path.name + ".bin"), os.O_WRONLY | os.O_CREAT, 0o600)
            source = os.open(buffer.path, os.O_RDWR)
            try:
                end = buffer.size
                while end > 0:
                    start = max(0, end - pacer.chunk)
                    pacer.reserve(end - start)
                    copy_range(source, target, start, end, buffer.path.name)
                    pacer.wait()
                    os.ftruncate(source, start)  # this chunk leaves the device
                    admission.freed()
                    done += end - start
                    end = start
            finally:
                os.close(source)
                os.close(target)
        pacer.check()
        _write_json(park / _simfs.MANIFEST, {"buffers": entries})
        (park / JOURNAL).unlink()
        return done
    finally:
        admission.finished()


def load_admitted(
    node_dir: Path,
    totals: dict[int, int],
    job: str,
    entries: list[dict[str, object]],
    pacer: Any,
    admission: Admission,
    headroom: int,
) -> int:
    """Grow and fill `job`'s buffers chunk by chunk as memory is admitted; bytes copied.
    Leaves the manifest (the caller commits). On failure the grown memory is given back
    (the job stays parked) before raising."""
    folder = node_dir / _simfs.JOBS_DIR / job
    park = _simfs.parked_dir(node_dir, job)
    grown: list[Path] = []
    done = 0
    try:
        for entry in entries:
            path = folder / str(entry["name"])
            size = int(str(entry["size"]))
            device = int(str(entry["device"]))
            if not path.exists():
                raise OSError(f"buffer {path.name} is gone")
            grown.append(path)
            source = os.open(park / (path.name + ".bin"), os.O_RDONLY)
            target = os.open(path, os.O_RDWR)
            try:
                current = os.fstat(target).st_size
                while current < size:
                    step = min(pacer.chunk, size - current)
                    _admit(
                        node_dir, totals, device, target, current + step, admission, pacer, headroom
                    )
                    pacer.reserve(step)
                    copy_range(source, target, current, current + step, path.name)
                    pacer.wait()
                    current += step
                    done += step
            finally:
                os.close(source)
                os.close(target)
        pacer.check()
    except BaseException:
        for path in grown:
            os.truncate(path, 0)
        raise
    return done


def _admit(
    node_dir: Path,
    totals: dict[int, int],
    device: int,
    fd: int,
    size: int,
    admission: Admission,
    pacer: Any,
    headroom: int,
) -> None:
    """Grow the buffer open as `fd` to `size` once device `device` has room for it."""
    total = totals.get(device, 0)
    while True:
        pacer.check()
        seen = admission.generation
        leaving = admission.pending > 0
        with _simfs.device_lock(node_dir, device, pacer.deadline):
            used = _simfs.used_bytes(node_dir).get(device, 0)
            needed = size - os.fstat(fd).st_size
            limit = total - headroom if leaving else total
            if used + needed <= limit:
                os.ftruncate(fd, size)
                if leaving:
                    admission.overlapped = True
                return
            if not leaving:
                raise DeviceMemoryError(
                    f"device {device} out of memory: needs {needed} bytes, "
                    f"{max(0, total - used)} of {total} free"
                )
        admission.wait(seen, pacer.deadline)


def undo_snapshot(node_dir: Path, job: str, pids: tuple[int, ...]) -> None:
    """Put back every chunk an outgoing half freed (from the journal, or the manifest of a
    committed half), drop the parked copy and let the job run."""
    park = _simfs.parked_dir(node_dir, job)
    record = park / _simfs.MANIFEST
    if not record.exists():
        record = park / JOURNAL
    if record.exists():
        entries = json.loads(record.read_text()).get("buffers", [])
        folder = node_dir / _simfs.JOBS_DIR / job
        for entry in entries:
            path = folder / str(entry["name"])
            size = int(entry["size"])
            copy = park / (path.name + ".bin")
            if not path.exists() or not copy.exists():
                continue
            target = os.open(path, os.O_RDWR)
            source = os.open(copy, os.O_RDONLY)
            try:
                current = os.fstat(target).st_size
                if current < size:
                    os.ftruncate(target, size)
                    copy_range(source, target, current, size, path.name)
            finally:
                os.close(source)
                os.close(target)
        (park / _simfs.MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(park, ignore_errors=True)
    _freeze.resume(pids)


def interrupted(node_dir: Path, job: str) -> bool:
    """True when `job` has a journal and no manifest: a swap stopped half-way."""
    park = _simfs.parked_dir(node_dir, job)
    return (park / JOURNAL).exists() and not (park / _simfs.MANIFEST).exists()


def copy_range(source_fd: int, target_fd: int, start: int, end: int, name: str) -> None:
    offset = start
    while offset < end:
        copied = os.copy_file_range(source_fd, target_fd, end - offset, offset, offset)
        if copied == 0:
            raise OSError(f"{name}: shorter than {end} bytes")
        offset += copied
