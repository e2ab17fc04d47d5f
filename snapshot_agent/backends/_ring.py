"""The `cuda` backend's own copy path for the driver's custom storage (CUDA 13.4+).

With custom storage the driver maps a locked process's device memory into the agent's
context (one contiguous region per GPU, with a stream) and the agent copies it. This module
copies a region through a ring of N pinned host buffers of `chunk` bytes each, on the
region's stream: the D2H copy of chunk k+1 is in flight while chunk k is written to the
host-side store (restore: the store read of chunk k+1 overlaps the H2D copy of chunk k).
Chunk i uses ring slot i mod N; slot reuse waits on the event recorded after its last copy.

`PinnedPool` is the node's bounded pool of those buffers: kept across switches (pinning
costs far more than copying), never above its limit, grown only while the host-memory
guard says the growth leaves the node's reserve (counting the bytes still being parked),
and trimmed when host memory falls below the reserve.

Everything here is synchronous and runs in the backend's worker threads; the driver calls
come through `Copier` (cuda.py implements it over `cuda.bindings.driver`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlslice.snapshot_agent import memguard

DEFAULT_CHUNK_BYTES = 64 << 20
DEFAULT_RING_BUFFERS = 4
DEFAULT_POOL_BYTES = 1 << 30


class Copier(Protocol):
    """The driver calls the ring needs. Each raises on a CUDA error."""

    def d2h(self, host: int, device: int, nbytes: int, stream: Any) -> None: ...

    def h2d(self, device: int, host: int, nbytes: int, stream: Any) -> None: ...

    def d2h_sync(self, host: int, device: int, nbytes: int) -> None: ...

    def event(self) -> Any: ...

    def record(self, event: Any, stream: Any) -> None: ...

    def wait(self, event: Any) -> None: ...

    def sync(self, stream: Any) -> None: ...

    def alloc_host(self, nbytes: int) -> int: ...

    def free_host(self, pointer: int) -> None: ...


@dataclass(frozen=True)
class Region:
    """One GPU's mapped memory of a checkpoint or restore operation."""

    device: int
    """Address of the mapping in the agent's context."""
    size: int
    stream: Any


class ChunkError(Exception):
    """A chunk's copy or store failed; `stored` chunks (indexes) made it to the store."""

    def __init__(self, index: int, cause: BaseException, stored: frozenset[int]) -> None:
        super().__init__(f"chunk {index}: {cause}")
        self.index = index
        self.cause = cause
        self.stored = stored


def view(pointer: int, nbytes: int) -> memoryview:
    """A writable byte view of host memory at `pointer` (no copy)."""
    return memoryview((ctypes.c_char * nbytes).from_address(pointer)).cast("B")


def chunks(size: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk of a region."""
    return [(offset, min(chunk, size - offset)) for offset in range(0, size, chunk)]


# --- the pool ----------------------------------------------------------------------------


class PinnedPool:
    """The node's pinned staging buffers, all of `chunk` bytes, at most `limit` bytes."""

    def __init__(
        self,
        *,
        limit: int,
        chunk: int,
        reserve: int,
        host_available: Callable[[], int],
        pending: Callable[[], int] = lambda: 0,
    ) -> None:
        self.limit = limit
        self.chunk = chunk
        self._reserve = reserve
        self._available = host_available
        self.pending = pending
        """Bytes moves under way still have to park (set by the backend that owns the pool)."""
        self._idle: list[int] = []
        self._leased = 0
        self._free_fn: Callable[[int], None] | None = None
        self._cond = threading.Condition()
        self.allocations = 0
        self.evictions = 0

    @property
    def total_bytes(self) -> int:
        """Pinned bytes held now, leased and idle."""
        with self._cond:
            return (len(self._idle) + self._leased) * self.chunk

    def _growth_refused(self) -> str | None:
        held = (len(self._idle) + self._leased) * self.chunk
        if held + self.chunk > self.limit:
            return f"pinned pool at its limit ({held} of {self.limit} bytes)"
        return memguard.pinned_refusal(
            self.chunk,
            host_available=self._available(),
            reserve=self._reserve,
            pending=self.pending(),
        )

    @contextlib.contextmanager
    def lease(self, wanted: int, copier: Copier, *, timeout: float) -> Iterator[list[int]]:
        """Up to `wanted` buffers (at least one): idle ones first, then new ones while the
        limit and the guard allow; waits up to `timeout` seconds for one to come back when
        none can be had. TimeoutError when none came."""
        taken = self._take(wanted, copier, timeout)
        try:
            yield taken
        finally:
            with self._cond:
                self._leased -= len(taken)
                self._idle.extend(taken)
                self._cond.notify_all()
            self.trim()

    def _take(self, wanted: int, copier: Copier, timeout: float) -> list[int]:
        end = time.monotonic() + timeout
        with self._cond:
            self._free_fn = copier.free_host
            while True:
                taken = [self._idle.pop() for _ in range(min(wanted, len(self._idle)))]
                self._leased += len(taken)  # counted at once: the growth check sees them
                while len(taken) < wanted and self._growth_refused() is None:
                    self._leased += 1
                    try:
                        taken.append(copier.alloc_host(self.chunk))
                    except BaseException:
                        self._leased -= 1 + len(taken)
                        self._idle.extend(taken)
                        raise
                    self.allocations += 1
                if taken:
                    return taken
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no pinned staging buffer free: {self._growth_refused()}")
                self._cond.wait(left)

    def trim(self) -> int:
        """Free idle buffers past the limit, and every idle one while host memory is below
        the reserve; bytes freed."""
        with self._cond:
            freed: list[int] = []
            while self._idle and (len(self._idle) + self._leased) * self.chunk > self.limit:
                freed.append(self._idle.pop())
            while self._idle and memguard.pinned_refusal(
                0, host_available=self._available(), reserve=self._reserve
            ):
                freed.append(self._idle.pop())
            free = self._free_fn
        for pointer in freed:
            if free is not None:
                free(pointer)
        self.evictions += len(freed)
        return len(freed) * self.chunk

    def close(self) -> None:
        """Free every idle buffer."""
        with self._cond:
            freed, self._idle = self._idle, []
            free = self._free_fn
        for pointer in freed:
            if free is not None:
                free(pointer)


# --- the host-side store -----------------------------------------------------------------


class RegionFile:
    """One region's parked bytes: a file in the store folder (a tmpfs by default, so the
    copy is host memory and survives an agent restart)."""

    def __init__(self, path: Path, size: int, *, create: bool) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if create else 0)
        self._fd = os.open(path, flags, 0o600)
        if create:
            os.ftruncate(self._fd, size)

    def write(self, offset: int, data: memoryview) -> None:
        done = 0
        while done < len(data):
            done += os.pwrite(self._fd, data[done:], offset + done)

    def read(self, offset: int, into: memoryview) -> None:
        done = 0
        while done < len(into):
            got = os.preadv(self._fd, [into[done:]], offset + done)
            if got == 0:
                raise OSError(f"{self.path}: short read at {offset + done}")
            done += got

    def close(self) -> None:
        os.close(self._fd)


# --- the ring ----------------------------------------------------------------------------


def copy_out(
    copier: Copier,
    region: Region,
    buffers: list[int],
    chunk: int,
    store: Callable[[int, memoryview], None],
) -> None:
    """Device region -> store, chunk by chunk through the ring. ChunkError on a failure,
    once nothing is in flight any more."""
    parts = chunks(region.size, chunk)
    events = [copier.event() for _ in buffers]
    inflight: deque[int] = deque()
    stored: set[int] = set()
    at = [0]  # the chunk being copied or stored: the one a failure is about

    def drain() -> None:
        index = at[0] = inflight.popleft()
        slot = index % len(buffers)
        offset, length = parts[index]
        copier.wait(events[slot])
        store(offset, view(buffers[slot], length))
        stored.add(index)

    try:
        for index, (offset, length) in enumerate(parts):
            if len(inflight) == len(buffers):
                drain()  # frees slot index mod N: chunk index - N is the oldest
            slot = index % len(buffers)
            at[0] = index
            copier.d2h(buffers[slot], region.device + offset, length, region.stream)
            copier.record(events[slot], region.stream)
            inflight.append(index)
        while inflight:
            drain()
    except BaseException as error:
        with contextlib.suppress(Exception):
            copier.sync(region.stream)  # no DMA into a buffer that goes back to the pool
        raise ChunkError(at[0], error, frozenset(stored)) from error


def copy_in(
    copier: Copier,
    region: Region,
    buffers: list[int],
    chunk: int,
    load: Callable[[int, memoryview], None],
) -> None:
    """Store -> device region, the reverse of `copy_out`."""
    parts = chunks(region.size, chunk)
    events = [copier.event() for _ in buffers]
    index = 0
    try:
        for index, (offset, length) in enumerate(parts):
            slot = index % len(buffers)
            if index >= len(buffers):
                copier.wait(events[slot])  # the slot's previous H2D has finished
            load(offset, view(buffers[slot], length))
            copier.h2d(region.device + offset, buffers[slot], length, region.stream)
            copier.record(events[slot], region.stream)
        copier.sync(region.stream)
    except BaseException as error:
        with contextlib.suppress(Exception):
            copier.sync(region.stream)
        raise ChunkError(index, error, frozenset()) from error


def rescue(copier: Copier, region: Region, chunk: int, stored: frozenset[int]) -> dict[int, bytes]:
    """The chunks the store lacks, copied synchronously into agent memory (offset ->
    bytes): what a rollback needs once a snapshot's ring failed, since the driver offers no
    abort and completing releases the device copy."""
    kept: dict[int, bytes] = {}
    for index, (offset, length) in enumerate(chunks(region.size, chunk)):
        if index in stored:
            continue
        buffer = ctypes.create_string_buffer(length)
        copier.d2h_sync(ctypes.addressof(buffer), region.device + offset, length)
        kept[offset] = buffer.raw
    return kept
