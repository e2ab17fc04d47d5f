"""Processes the agent verified: identity that survives pid reuse, children, exit watching.

A process is known by (pid, start time, cgroup): a pid that was reused by another process
no longer matches, so the agent never acts on a stranger. A job's processes are its
registered ones plus their descendants, found afresh on every move (a trainer's data-loader
workers, say). Exits are noticed through a pidfd (no polling), and an exited process leaves
its job at once, so even a stranger started in the same clock tick under the same pid is
never taken for it while the agent runs; across an agent restart, start time and cgroup
tell them apart (`tests/system/faults/test_pid_reuse.py` recycles a pid for real).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import psutil


@dataclass(frozen=True)
class ProcessRef:
    """One verified process."""

    pid: int
    start: float
    """Its start time (psutil `create_time`), which tells it from a later process with its pid."""
    cgroup: str = ""
    """Its cgroup (`/proc/<pid>/cgroup`, one line per hierarchy); "" where unreadable. A
    process never changes cgroup by being reused, so a stranger in another cgroup (another
    container, pod or job) never matches, whatever its start time."""


def cgroup_of(pid: int) -> str:
    """The content of `/proc/<pid>/cgroup`, stripped ("" when unreadable)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def identify(pid: int) -> ProcessRef | None:
    """The process now running as `pid`, or None when there is none (or it is a zombie)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return ProcessRef(pid, process.create_time(), cgroup_of(pid))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def alive(ref: ProcessRef) -> bool:
    """True while the very process `ref` names still runs (same pid, start time, cgroup; a
    ref saved before cgroups were recorded matches on pid and start time)."""
    now = identify(ref.pid)
    if now is None or now.start != ref.start:
        return False
    return not ref.cgroup or now.cgroup == ref.cgroup


def family(refs: Iterable[ProcessRef]) -> tuple[int, ...]:
    """Pids of the live processes among `refs` and of all their descendants, sorted."""
    return families([refs])[0]


def families(groups: Sequence[Iterable[ProcessRef]]) -> list[tuple[int, ...]]:
    """`family` of each group of refs (zombies left out).

    Descendants are read from `/proc/<pid>/task/<tid>/children` (what CRIU walks), so the
    cost grows with the job's processes, not the node's: a walk of the whole process table
    cost a millisecond with 70 processes and grows with every pod on a busy node, and a
    switch and a Status each walk every job. A kernel without those files
    (CONFIG_PROC_CHILDREN unset) gets one read of the whole table instead."""
    children = _children_of if HAS_CHILDREN_FILES else _table_children()
    found = []
    for refs in groups:
        todo = [ref.pid for ref in refs if alive(ref)]
        pids = set(todo)
        while todo:
            for child in children(todo.pop()):
                if child not in pids and _state(child) not in (None, b"Z"):
                    pids.add(child)
                    todo.append(child)
        found.append(tuple(sorted(pids)))
    return found


HAS_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
"""Whether this kernel lists each thread's children in /proc (CONFIG_PROC_CHILDREN)."""


def _children_of(pid: int) -> list[int]:
    """`pid`'s children, over all its threads (a child belongs to the thread that forked it)."""
    kids: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids  # gone meanwhile
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                kids.extend(int(child) for child in handle.read().split())
        except OSError:
            continue  # the thread exited meanwhile
    return kids


def _table_children() -> Callable[[int], Sequence[int]]:
    """Children by parent from one read of the whole process table (`/proc/*/stat`)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(name))
    return lambda pid: children.get(pid, ())


def _state(pid: int) -> bytes | None:
    """`pid`'s one-letter state from /proc/<pid>/stat, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return None


class ExitWatcher:
    """Calls `on_exit(ref)` from the event loop when a watched process exits."""

    def __init__(self, on_exit: Callable[[ProcessRef], None]) -> None:
        self._on_exit = on_exit
        self._fds: dict[ProcessRef, int] = {}

    def watch(self, ref: ProcessRef) -> None:
        """Watch `ref`; calls back at once (soon) if it is already gone."""
        if ref in self._fds:
            return
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(ref.pid)
        except ProcessLookupError:
            loop.call_soon(self._on_exit, ref)
            return
        except OSError:
            return  # no pidfd here: exits are noticed when the job is next looked at
        if not alive(ref):  # the pid was reused between identify() and pidfd_open()
            os.close(fd)
            loop.call_soon(self._on_exit, ref)
            return
        self._fds[ref] = fd
        loop.add_reader(fd, self._exited, ref)

    def _exited(self, ref: ProcessRef) -> None:
        self.forget(ref)
        self._on_exit(ref)

    def forget(self, ref: ProcessRef) -> None:
        """Stop watching `ref`."""
        fd = self._fds.pop(ref, None)
        if fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def close(self) -> None:
        """Stop watching everything."""
        for ref in list(self._fds):
            self.forget(ref)


class ProcessSource(Protocol):
    """What finds a node's jobs' processes besides their own registration (Kubernetes
    mode: the pods' processes); handed to the engine when it is made."""

    async def rediscover(self) -> None:
        """Make the engine's view of the jobs' processes current; the engine awaits it
        before every move (a process that started on the GPU since the last look)."""
        ...
