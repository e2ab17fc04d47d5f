"""Emulated device memory for the agent's `sim` backend (machines without GPUs).

    from rlslice.client import sim

    device = sim.attach()                      # device 0 of this node
    weights = device.alloc(256 << 20, tag="weights")
    array = numpy.frombuffer(weights, dtype=numpy.float32)   # writable, shared memory

Each buffer is a shared-memory file under `<root>/<node>/jobs/<job>/` that the node's agent
sees; while the job is parked the agent has stopped the process, copied the bytes away and
freed the device, and on restore the same mapping holds the same bytes again. Allocating
beyond a device's capacity raises `SimOutOfMemoryError`, worded like CUDA's.

Where the device lives, first match wins: `node_dir=`; `$RLSLICE_SIM_DIR`;
`$RLSLICE_SIM_ROOT` (default `/dev/shm/rlslice-sim`) joined with the node name
(`node=`, `$RLSLICE_NODE`, or the host name as a DNS-1123 label). The job comes from `job=`
or `$RLSLICE_JOB`. The layout is the agent's (`rlslice.snapshot_agent.backends._simfs`).

`attach(index)` counts devices as CUDA does: with `CUDA_VISIBLE_DEVICES` set (by Slurm's
`--gres=gpu:N`, or by hand) to a list of device numbers, `index` is a position in that
list, so `attach(0)` under `CUDA_VISIBLE_DEVICES=2,3` is the node's emulated device 2.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import json
import mmap
import os
import re
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from rlslice import env
from rlslice._errors import ResourceExhaustedError
from rlslice._ids import validate_id
from rlslice.units import format_bytes

__all__ = ["SimBuffer", "SimJobDevice", "SimOutOfMemoryError", "attach"]

ENV_JOB = env.JOB
_counter = itertools.count()
_live: weakref.WeakSet[SimBuffer] = weakref.WeakSet()


class SimOutOfMemoryError(ResourceExhaustedError, MemoryError):
    """An allocation does not fit in the emulated device's free memory."""


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _used(node_dir: Path, index: int) -> int:
    prefix = f"d{index}-"
    total = 0
    jobs = node_dir / "jobs"
    for job in os.scandir(jobs):
        if not job.is_dir():
            continue
        for entry in os.scandir(job.path):
            if entry.name.startswith(prefix) and entry.name.endswith(".buf"):
                with contextlib.suppress(FileNotFoundError):
                    total += entry.stat().st_size
    return total


class SimBuffer(mmap.mmap):
    """A writable buffer of emulated device memory (an `mmap`: use it with memoryview,
    `numpy.frombuffer`, `torch.frombuffer`). `free()` gives the memory back."""

    tag: str
    """The tag it was allocated with."""
    nbytes: int
    """Its size in bytes."""
    path: Path
    """Its shared-memory file."""
    owner: int
    """Pid of the process that allocated it (a forked child does not free it at exit)."""

    def free(self) -> None:
        """Unmap the buffer and give its device memory back. Views of it must be gone."""
        if not self.closed:
            self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class SimJobDevice:
    """One emulated device of this node, as seen by one job."""

    def __init__(self, node_dir: Path, index: int, job: str, total_bytes: int, name: str) -> None:
        self.node_dir = node_dir
        self.index = index
        self.job = job
        self.total_bytes = total_bytes
        """Capacity in bytes."""
        self.name = name

    def used_bytes(self) -> int:
        """Bytes in use on the device by every job."""
        return _used(self.node_dir, self.index)

    def alloc(self, nbytes: int, *, tag: str = "buffer") -> SimBuffer:
        """A new zero-filled buffer of `nbytes`; raises SimOutOfMemoryError when it does not fit."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"nbytes: must be a positive integer, got {nbytes!r}")
        clean = re.sub(r"[^a-zA-Z0-9_-]+", "-", tag)[:40] or "buffer"
        folder = self.node_dir / "jobs" / self.job
        folder.mkdir(exist_ok=True)
        path = folder / f"d{self.index}-{os.getpid()}-{next(_counter)}-{clean}.buf"
        with _locked(self.node_dir / f"d{self.index}.lock"):
            used = _used(self.node_dir, self.index)
            if used + nbytes > self.total_bytes:
                raise SimOutOfMemoryError(
                    f"CUDA out of memory (emulated). Tried to allocate {format_bytes(nbytes)} "
                    f"(GPU {self.index}; {format_bytes(self.total_bytes)} total capacity; "
                    f"{format_bytes(used)} already allocated; "
                    f"{format_bytes(max(0, self.total_bytes - used))} free)"
                )
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, nbytes)
                buffer = SimBuffer(fd, nbytes)
            except BaseException:
                os.close(fd)
                path.unlink()
                raise
        os.close(fd)
        buffer.tag = tag
        buffer.nbytes = nbytes
        buffer.path = path
        buffer.owner = os.getpid()
        _live.add(buffer)
        return buffer


_attach_lock = threading.Lock()


def attach(
    index: int = 0,
    *,
    job: str | None = None,
    node: str | None = None,
    node_dir: str | os.PathLike[str] | None = None,
) -> SimJobDevice:
    """The emulated device `index` of this node, for job `job` (see the module doc).

    `index` counts the devices `CUDA_VISIBLE_DEVICES` lists, when it is set."""
    job = validate_id(job or os.environ.get(ENV_JOB, ""), "job")
    index = _visible_device(index)
    if node_dir is None:
        node_dir = env.sim_node_dir(os.environ, node)
    folder = Path(node_dir)
    try:
        table = json.loads((folder / "devices.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no emulated devices at {folder}: is an agent with the sim backend running "
            "for this node (or RLSLICE_SIM_ROOT / RLSLICE_NODE set as for the agent)?"
        ) from None
    for device in table["devices"]:
        if int(device["index"]) == index:
            with _attach_lock:
                _register_cleanup()
            return SimJobDevice(folder, index, job, int(device["total_bytes"]), str(device["name"]))
    raise ValueError(f"index: no emulated device {index} at {folder}")


def _visible_device(index: int) -> int:
    """The node's device number for the process's device `index` (CUDA's numbering)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not visible:
        return index
    listed = [item.strip() for item in visible.split(",")]
    if not all(item.isdigit() for item in listed):
        return index  # UUIDs or MIG names: no emulated counterpart, count as given
    if not 0 <= index < len(listed):
        raise ValueError(f"index: {index} is not among CUDA_VISIBLE_DEVICES={visible}")
    return int(listed[index])


_cleanup_registered = False


def _register_cleanup() -> None:
    global _cleanup_registered
    if not _cleanup_registered:
        atexit.register(_free_all)
        _cleanup_registered = True


def _free_all() -> None:
    # A process that exits gives its device memory back, as a CUDA context does.
    for buffer in list(_live):
        if buffer.owner == os.getpid():
            with contextlib.suppress(OSError):
                buffer.path.unlink()
