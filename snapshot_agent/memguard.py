"""The host-memory guard: refuse a snapshot that host memory cannot take.

`refusal()` is pure; `cgroup_headrooms()` reads the job's cgroup v2 memory limits from
/proc and /sys (its `root` parameters let tests point it at a fixture tree). A snapshot
must fit in host memory available minus a reserve, and in every cgroup of the job that has
a limit (the CUDA driver keeps checkpointed memory inside the job's own processes, so the
job's cgroup pays for it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rlslice.units import format_bytes as _size

GiB = 1 << 30


@dataclass(frozen=True)
class CgroupHeadroom:
    """A memory-limited cgroup of the job: how much more it may take."""

    path: str
    limit: int
    current: int

    @property
    def free(self) -> int:
        """Bytes the cgroup may still take."""
        return max(0, self.limit - self.current)


def refusal(
    job: str,
    nbytes: int,
    *,
    host_available: int,
    reserve: int,
    cgroups: Iterable[CgroupHeadroom] = (),
) -> str | None:
    """None when `nbytes` of parked state fit, else the one-line reason to refuse."""
    if nbytes + reserve > host_available:
        return (
            f"host memory: snapshot of job {job} needs {_size(nbytes)} plus a reserve of "
            f"{_size(reserve)}, only {_size(host_available)} available"
        )
    for cgroup in cgroups:
        if nbytes > cgroup.free:
            return (
                f"host memory: snapshot of job {job} needs {_size(nbytes)}, its cgroup "
                f"{cgroup.path} has {_size(cgroup.free)} left of its {_size(cgroup.limit)} limit"
            )
    return None


def pinned_refusal(
    extra: int, *, host_available: int, reserve: int, pending: int = 0
) -> str | None:
    """None when `extra` more bytes of pinned staging leave the node's reserve free, else the
    reason. `pending`: bytes still to be parked by moves under way (admitted by `refusal`,
    not yet taken from host memory), so pinned bytes + parked bytes stay within the budget."""
    if extra + pending + reserve > host_available:
        return (
            f"host memory: {_size(extra)} more pinned staging with {_size(pending)} still "
            f"being parked would leave less than the reserve of {_size(reserve)} "
            f"({_size(host_available)} available)"
        )
    return None


def _cgroup_of(pid: int, proc: Path) -> str | None:
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        # cgroup v2: "0::/path"; v1 lines name controllers and are not read here.
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            return path
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def cgroup_headrooms(
    pids: Iterable[int],
    *,
    proc: Path = Path("/proc"),
    sys_fs_cgroup: Path = Path("/sys/fs/cgroup"),
) -> list[CgroupHeadroom]:
    """The memory-limited cgroups (v2) the processes belong to, each once.

    A cgroup's limit is the tightest `memory.max` on its path up to the root, since an
    ancestor's limit binds its children too.
    """
    seen: dict[str, CgroupHeadroom] = {}
    for pid in pids:
        path = _cgroup_of(pid, proc)
        if path is None or path in seen:
            continue
        best: CgroupHeadroom | None = None
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), 0, -1):
            here = "/" + "/".join(parts[:depth])
            directory = sys_fs_cgroup.joinpath(*parts[:depth])
            limit = _read_int(directory / "memory.max")
            if limit is None:
                continue
            current = _read_int(directory / "memory.current") or 0
            candidate = CgroupHeadroom(here, limit, current)
            if best is None or candidate.free < best.free:
                best = candidate
        if best is not None:
            seen[path] = best
    return list(seen.values())
