"""The disk tier: parked bytes written to and read back from a local spill directory.

One file per part. `write_part` copies a part's host-memory file (a parked copy) into the
spill directory in large sequential chunks and returns a `SpillRecord` (file, length,
CRC-32); `read_part` copies it back, verifying length and checksum before the target
file appears, so a torn or damaged spill file is a `SpillFileError` naming the file, never
silently wrong bytes.

The copies are pipelined through a bounded set of page-aligned buffers (mmap-allocated, as
O_DIRECT needs), so at most `depth` chunks are in memory at once, whatever the size of
the part: a spill reads and checksums in one thread while the caller's thread writes; a
fill keeps `depth` reads in flight (O_DIRECT gets no kernel read-ahead) and checksums and
writes them in order. Spill files are
opened with O_DIRECT where the filesystem allows (local disks: no page cache filled with
bytes that are about to be read once, if ever), buffered I/O where it does not (tmpfs
answers EINVAL), then their cached pages are dropped with posix_fadvise. A full disk
(ENOSPC) is a `SpillFullError` naming the directory; the half-written file is removed and
the source is never touched.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import errno
import mmap
import os
import queue
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlslice.snapshot_agent.backends.base import BackendError

__all__ = [
    "ALIGN",
    "CHUNK_BYTES",
    "SpillError",
    "SpillFileError",
    "SpillFullError",
    "SpillRecord",
    "failure",
    "read_part",
    "write_part",
]

ALIGN = 4096
"""Alignment of O_DIRECT buffers, offsets and lengths (a page; covers 512-byte sectors)."""
CHUNK_BYTES = 8 << 20
"""Bytes per read and write."""
DEPTH = 4
"""Chunks in flight: between the reading and the writing thread of a spill, and reads
issued at once by a fill."""

_O_DIRECT = getattr(os, "O_DIRECT", 0)


class SpillError(BackendError):
    """A spill or fill failed; the message is one line and names the file or directory."""


class SpillFileError(SpillError):
    """A spill file is missing, torn (shorter or longer than recorded) or damaged (its
    checksum differs): the part cannot come back, and the job faults with this reason."""


class SpillFullError(SpillError):
    """The spill directory's filesystem is full: the part stays in host memory."""


@dataclass(frozen=True)
class SpillRecord:
    """Where one spilled part lives and what it must read back as."""

    file: str
    """Absolute path of the spill file."""
    length: int
    """Bytes of the part."""
    crc32: int
    """CRC-32 (zlib) of the part's bytes."""

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-able data (the tier index)."""
        return {"file": self.file, "length": self.length, "crc32": self.crc32}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpillRecord:
        """The record written by `to_json`."""
        return cls(str(data["file"]), int(data["length"]), int(data["crc32"]))


def _buffers(count: int, size: int) -> list[mmap.mmap]:
    """Page-aligned anonymous buffers (an mmap starts on a page boundary)."""
    return [mmap.mmap(-1, size) for _ in range(count)]


def _open_direct(path: Path, flags: int) -> tuple[int, bool]:
    """`path` opened with O_DIRECT when its filesystem allows, else buffered; (fd, direct)."""
    if _O_DIRECT:
        try:
            return os.open(path, flags | _O_DIRECT, 0o600), True
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o600), False


def _drop_cache(fd: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


class _Pipe:
    """Chunks from a producer thread to the caller through a bounded queue of buffers."""

    def __init__(self, chunk: int, depth: int) -> None:
        self.free: queue.Queue[mmap.mmap] = queue.Queue()
        for buffer in _buffers(depth, chunk):
            self.free.put(buffer)
        self.full: queue.Queue[tuple[mmap.mmap, int] | BaseException | None] = queue.Queue()
        self.stop = threading.Event()
        self.crc = 0

    def produce(self, fill: Any) -> None:
        """Thread body: `fill(buffer) -> bytes read` until 0; each chunk checksummed."""
        try:
            while not self.stop.is_set():
                buffer = self.free.get()
                count = fill(buffer)
                if count == 0:
                    self.free.put(buffer)
                    break
                self.crc = zlib.crc32(memoryview(buffer)[:count], self.crc)
                self.full.put((buffer, count))
            self.full.put(None)
        except BaseException as error:  # handed to the consumer, raised there
            self.full.put(error)

    def chunks(self, fill: Any) -> Iterator[tuple[mmap.mmap, int]]:
        """Run the producer; yield (buffer, bytes) in order; give each buffer back after."""
        thread = threading.Thread(target=self.produce, args=(fill,), daemon=True)
        thread.start()
        try:
            while True:
                item = self.full.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                self.free.put(item[0])
        finally:
            self.stop.set()
            while thread.is_alive():  # unblock a producer waiting for a free buffer
                with contextlib.suppress(queue.Full):
                    self.free.put_nowait(mmap.mmap(-1, ALIGN))
                thread.join(0.05)


def _read_ahead(fd: int, chunk: int, depth: int) -> Iterator[tuple[mmap.mmap, int]]:
    """The file's chunks in order, `depth` reads in flight at once (O_DIRECT reads get no
    kernel read-ahead: the device sees as many requests as there are threads here)."""
    buffers = _buffers(depth, chunk)
    with concurrent.futures.ThreadPoolExecutor(depth, thread_name_prefix="fill") as pool:
        flight: collections.deque[tuple[mmap.mmap, concurrent.futures.Future[int]]]
        flight = collections.deque()
        offset = 0
        for buffer in buffers:
            flight.append((buffer, pool.submit(os.preadv, fd, [buffer], offset)))
            offset += chunk
        try:
            while flight:
                buffer, future = flight.popleft()
                count = future.result()
                if count == 0:
                    return
                yield buffer, count
                if count < chunk:
                    return
                flight.append((buffer, pool.submit(os.preadv, fd, [buffer], offset)))
                offset += chunk
        finally:
            for _, future in flight:
                future.cancel()
            concurrent.futures.wait([f for _, f in flight])


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        done = os.write(fd, view)
        view = view[done:]


def write_part(
    source: Path, target: Path, *, chunk: int = CHUNK_BYTES, depth: int = DEPTH
) -> SpillRecord:
    """Copy the host-memory file `source` to the spill file `target`, durably.

    SpillFullError when the disk fills (nothing is left behind in the spill directory);
    SpillError for any other failure. `source` is only read."""
    chunk = max(ALIGN, chunk // ALIGN * ALIGN)
    target.parent.mkdir(parents=True, exist_ok=True)
    source_fd = os.open(source, os.O_RDONLY)
    try:
        fd, direct = _open_direct(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    except OSError as error:
        os.close(source_fd)
        raise failure(error, "write", target) from error
    pipe = _Pipe(chunk, depth)
    length = 0
    try:
        for buffer, count in pipe.chunks(lambda b: os.readv(source_fd, [b])):
            padded = -(-count // ALIGN) * ALIGN if direct else count
            if padded != count:  # the last chunk: O_DIRECT writes whole blocks
                buffer[count:padded] = bytes(padded - count)
            _write_all(fd, memoryview(buffer)[:padded])
            length += count
        if direct and length % ALIGN:
            os.ftruncate(fd, length)
        os.fsync(fd)
        _drop_cache(fd)
    except OSError as error:
        os.close(fd)
        target.unlink(missing_ok=True)
        raise failure(error, "write", target) from error
    except BaseException:
        os.close(fd)
        target.unlink(missing_ok=True)
        raise
    finally:
        os.close(source_fd)
    os.close(fd)
    return SpillRecord(str(target), length, pipe.crc)


def read_part(
    record: SpillRecord, target: Path, *, chunk: int = CHUNK_BYTES, depth: int = DEPTH
) -> None:
    """Copy the spill file of `record` back to the host-memory file `target`.

    The bytes are written to a temporary file beside `target`, which is renamed into place
    only once length and checksum match: SpillFileError (naming the spill file) otherwise,
    and `target` is not created."""
    chunk = max(ALIGN, chunk // ALIGN * ALIGN)
    path = Path(record.file)
    try:
        fd, _direct = _open_direct(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SpillFileError(f"spill file {path} is missing") from None
    except OSError as error:
        raise SpillFileError(f"spill file {path}: {error.strerror or error}") from error
    temp = target.with_name(f".{target.name}.fill")
    out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    length = crc = 0
    try:
        for buffer, count in _read_ahead(fd, chunk, depth):
            length += count
            if length > record.length:
                break
            view = memoryview(buffer)[:count]
            crc = zlib.crc32(view, crc)
            _write_all(out, view)
        _drop_cache(fd)
    except OSError as error:
        os.close(out)
        temp.unlink(missing_ok=True)
        raise SpillFileError(f"spill file {path}: {error.strerror or error}") from error
    finally:
        os.close(fd)
    os.close(out)
    why = _mismatch(record, length, crc)
    if why is not None:
        temp.unlink(missing_ok=True)
        raise SpillFileError(f"spill file {path} is {why}")
    temp.replace(target)


def _mismatch(record: SpillRecord, length: int, crc: int) -> str | None:
    if length != record.length:
        return f"torn: {length} bytes read, {record.length} written"
    if crc != record.crc32:
        return f"damaged: checksum {crc:08x}, {record.crc32:08x} written"
    return None


def failure(error: OSError, verb: str, target: Path) -> SpillError:
    """The SpillError for `error` while doing `verb` to `target`: SpillFullError naming
    the directory when the disk is full."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return SpillFullError(
            f"spill directory {target.parent} is full ({error.strerror}): "
            "the part stays in host memory"
        )
    return SpillError(f"spill {verb} of {target}: {error.strerror or error}")
