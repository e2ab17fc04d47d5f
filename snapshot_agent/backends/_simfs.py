"""On-disk layout of the `sim` backend's emulated devices (the agent's side).

    <root>/<node>/devices.json              capacity of each device (written by the agent)
    <root>/<node>/d<i>.lock                 flock held while capacity is checked and taken
    <root>/<node>/jobs/<job>/d<i>-*.buf     device memory: one shared-memory file per buffer
    <root>/<node>/parked/<job>/             parked copies and their manifest (agent only)

A device's used memory is the sum of the sizes of its buffer files, so memory of a process
that dies uncleanly is still counted until the agent releases its job. `rlslice.client.sim`
writes the job side of the same layout; the tests run both against each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEVICES_FILE = "devices.json"
JOBS_DIR = "jobs"
PARKED_DIR = "parked"
MANIFEST = "manifest.json"
_BUFFER = re.compile(r"^d(\d+)-.*\.buf$")
_TAGGED = re.compile(r"^d\d+-\d+-\d+-(.+)\.buf$")


def clean_tag(tag: str) -> str:
    """`tag` as `rlslice.client.sim` writes it into a buffer's file name."""
    return re.sub(r"[^a-zA-Z0-9_-]+", "-", tag)[:40] or "buffer"


def buffer_tag(path: Path) -> str:
    """The part a buffer belongs to: the tag its job allocated it with (`alloc(tag=)`)."""
    match = _TAGGED.fullmatch(path.name)
    return match.group(1) if match is not None else "buffer"


@dataclass(frozen=True)
class SimFsDevice:
    """One emulated device."""

    index: int
    total_bytes: int
    name: str


@dataclass(frozen=True)
class BufferFile:
    """One buffer of a job: a file under the job's folder."""

    path: Path
    device: int
    size: int


def write_devices(node_dir: Path, devices: list[SimFsDevice]) -> None:
    """Create the node's folders and (re)write its device table atomically."""
    (node_dir / JOBS_DIR).mkdir(parents=True, exist_ok=True)
    # Jobs of any user of the node create their folders here, like /tmp.
    with contextlib.suppress(PermissionError):
        os.chmod(node_dir / JOBS_DIR, 0o1777)
    (node_dir / PARKED_DIR).mkdir(mode=0o700, exist_ok=True)
    table = {
        "devices": [
            {"index": d.index, "total_bytes": d.total_bytes, "name": d.name} for d in devices
        ]
    }
    temp = node_dir / f".{DEVICES_FILE}.{os.getpid()}"
    temp.write_text(json.dumps(table))
    os.chmod(temp, 0o644)
    temp.replace(node_dir / DEVICES_FILE)
    for device in devices:
        lock = node_dir / f"d{device.index}.lock"
        lock.touch(exist_ok=True)
        with contextlib.suppress(PermissionError):
            os.chmod(lock, 0o666)


def read_devices(node_dir: Path) -> list[SimFsDevice]:
    """The node's device table."""
    table = json.loads((node_dir / DEVICES_FILE).read_text())
    return [
        SimFsDevice(int(d["index"]), int(d["total_bytes"]), str(d.get("name", "")))
        for d in table["devices"]
    ]


@contextlib.contextmanager
def device_lock(node_dir: Path, index: int, deadline: float) -> Iterator[None]:
    """Hold device `index`'s capacity lock (shared with jobs allocating on it).

    A job stopped while allocating still holds the lock, so the agent never blocks on it
    past `deadline` (`time.time()` clock): TimeoutError then.
    """
    fd = os.open(node_dir / f"d{index}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() > deadline:
                    raise TimeoutError(f"device {index}: its lock stayed taken") from None
                time.sleep(delay)  # in a worker thread
                delay = min(delay * 2, 0.05)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def job_buffers(node_dir: Path, job: str) -> list[BufferFile]:
    """The job's buffer files, sorted by name."""
    folder = node_dir / JOBS_DIR / job
    found: list[BufferFile] = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    for entry in entries:
        match = _BUFFER.fullmatch(entry.name)
        if match is None:
            continue
        try:
            size = entry.stat().st_size
        except FileNotFoundError:
            continue  # freed meanwhile
        found.append(BufferFile(Path(entry.path), int(match.group(1)), size))
    return sorted(found, key=lambda b: b.path.name)


def used_bytes(node_dir: Path) -> dict[int, int]:
    """Bytes in use per device index, over every job's buffers."""
    used: dict[int, int] = {}
    try:
        jobs = [entry.name for entry in os.scandir(node_dir / JOBS_DIR) if entry.is_dir()]
    except FileNotFoundError:
        return used
    for job in jobs:
        for buffer in job_buffers(node_dir, job):
            used[buffer.device] = used.get(buffer.device, 0) + buffer.size
    return used


def parked_dir(node_dir: Path, job: str) -> Path:
    """Where the job's parked copies live."""
    return node_dir / PARKED_DIR / job
