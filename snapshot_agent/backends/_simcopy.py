"""The `sim` backend's copies: paced on the node's duplex link, run in worker threads.

`Link` books each direction's bytes at its rate (under an optional shared cap), `Pacer`
paces one copy on it and stops it past its deadline, on cancellation or when another half
of a swap failed (`Aborted`); `copy_paced` moves a buffer's bytes in the kernel, and
`discard` frees a parked copy's pages off the caller's path.
"""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rlslice.snapshot_agent.backends import _simswap

#: The bytes a copy books on the link at a time (the default `chunk_bytes`).
CHUNK = 64 << 20


class Link:
    """A node's host link, full duplex: each direction paced at its own rate, both under an
    optional shared cap. A copy reserves its bytes before it runs and waits out what is
    left of its reservation after; concurrent copies in one direction queue behind each
    other, copies in opposite directions do not (unless the shared cap binds)."""

    def __init__(self, out_gbps: float, in_gbps: float, shared_gbps: float = 0.0) -> None:
        self._rates = {"out": out_gbps * 1e9, "in": in_gbps * 1e9}
        self._shared = shared_gbps * 1e9
        self._free = {"out": 0.0, "in": 0.0}
        self._shared_free = 0.0
        self._lock = threading.Lock()

    def reserve(self, direction: str, nbytes: int, after: float | None = None) -> float:
        """`time.perf_counter()` time by which `nbytes` more in `direction` may be done.

        `after`: when the copy's previous chunk was due (None: its first chunk starts now).
        A copy paced from its own schedule, not from the moment each chunk is asked for,
        takes bytes / rate however late a sleep wakes up."""
        with self._lock:
            now = time.perf_counter()
            start = now if after is None else min(now, after)
            until = start
            rate = self._rates[direction]
            if rate > 0:
                until = max(start, self._free[direction]) + nbytes / rate
                self._free[direction] = until
            if self._shared > 0:
                shared = max(start, self._shared_free) + nbytes / self._shared
                self._shared_free = shared
                until = max(until, shared)
            return until


class Pacer:
    """Paces one copy on the link; stops it past the deadline or when the waiting coroutine
    is cancelled (or, in a swap, when another half failed)."""

    def __init__(
        self,
        link: Link,
        direction: str,
        deadline: float,
        abort: threading.Event | None = None,
        chunk: int = CHUNK,
    ) -> None:
        self._link, self._direction = link, direction
        self.chunk = chunk
        self.deadline = deadline
        self.cancelled = threading.Event()
        self._abort = abort
        self._until: float | None = None

    def check(self) -> None:
        if self.cancelled.is_set():
            raise TimeoutError("the move was cancelled")
        if self._abort is not None and self._abort.is_set():
            raise Aborted("another half of the switch failed")
        if time.time() > self.deadline:
            raise TimeoutError("the copy ran past the deadline")

    def reserve(self, nbytes: int) -> None:
        """Before copying `nbytes`: book them on the link."""
        self.check()
        self._until = self._link.reserve(self._direction, nbytes, self._until)

    def wait(self) -> None:
        """After the copy: wait out the rest of its booking."""
        self.check()
        wait = (self._until or 0.0) - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


class Aborted(Exception):
    """A half of a swap stopped because another half failed."""


async def in_thread(fn: Callable[[], int], pacer: Pacer) -> int:
    """Run a copy in a thread. A cancelled caller stops the copy and waits for the thread,
    so nothing touches the job's files once this returns or raises."""
    future = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        pacer.cancelled.set()
        await asyncio.wait([future])
        raise


def copy_paced(source: Path, target_fd: int, size: int, pacer: Pacer, done: int) -> int:
    """Copy `size` bytes of `source` into `target_fd` from offset 0; return bytes done.

    copy_file_range keeps the bytes in the kernel: no mapping of the job's memory here."""
    source_fd = os.open(source, os.O_RDONLY)
    try:
        offset = 0
        while offset < size:
            step = min(pacer.chunk, size - offset)
            pacer.reserve(step)
            _simswap.copy_range(source_fd, target_fd, offset, offset + step, source.name)
            offset += step
            done += step
            pacer.wait()
    finally:
        os.close(source_fd)
    return done


def discard(folder: Path) -> None:
    """Remove `folder` off the caller's path: rename it aside now, free its pages later,
    in the one reaper thread (a thread started per call cost more than the rename on a
    busy node: two per switch)."""
    if not folder.exists():
        return
    trash = folder.with_name(f".trash-{folder.name}-{time.monotonic_ns()}")
    try:
        folder.rename(trash)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return
    _reaper().put(trash)


_trash: queue.SimpleQueue[Path] | None = None
_trash_lock = threading.Lock()


def _reaper() -> queue.SimpleQueue[Path]:
    """The queue of folders to remove, its daemon thread started on first use."""
    global _trash
    with _trash_lock:
        if _trash is None:
            _trash = queue.SimpleQueue()
            threading.Thread(
                target=_reap, args=(_trash,), name="rlslice-sim-reaper", daemon=True
            ).start()
        return _trash


def _reap(folders: queue.SimpleQueue[Path]) -> None:
    while True:
        shutil.rmtree(folders.get(), ignore_errors=True)


def _forget_reaper() -> None:
    """In a forked child: the parent's reaper thread is not there; start another on use."""
    global _trash
    _trash = None


os.register_at_fork(after_in_child=_forget_reaper)
