"""A `sim` swap with no byte to copy runs its halves on the loop, not in worker threads
(a hop costs more than the halves' few file operations), and parks and restores exactly
as the threaded path does; a swap with bytes still copies in worker threads. A restored
job's parked copy is freed by one reaper thread, however many swaps there are."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rlslice.client import sim
from rlslice.snapshot_agent.backends.base import BackendContext, BackendState, JobHandle
from rlslice.snapshot_agent.backends.sim import SimBackend

MiB = 1 << 20


@pytest.fixture
def backend(shm_root: Path, tmp_path: Path) -> SimBackend:
    options = {"root": str(shm_root), "capacity_bytes": str(64 * MiB)}
    return SimBackend(BackendContext(node="n1", state_dir=tmp_path, options=options))


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every call the swap hands to a worker thread."""
    seen: list[Any] = []
    original = asyncio.to_thread

    async def counted(function: Any, /, *args: Any, **kwargs: Any) -> Any:
        seen.append(function)
        return await original(function, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    return seen


def job(name: str) -> JobHandle:
    return JobHandle(job=name, group="g", pids=(), options={})


def swap(backend: SimBackend, out: str, into: str) -> Any:
    deadline = time.time() + 30
    return asyncio.run(backend.swap([job(out)], job(into), headroom_bytes=0, deadline=deadline))


def test_a_swap_of_empty_jobs_runs_on_the_loop_and_parks_and_restores(
    backend: SimBackend, hops: list[Any]
) -> None:
    for name in ("a", "b"):
        sim.attach(job=name, node_dir=backend.node_dir)  # no buffer: nothing to copy
    asyncio.run(backend.snapshot(job("b"), deadline=time.time() + 30))
    hops.clear()
    done = swap(backend, "a", "b")
    assert hops == []
    assert [o.bytes for o in done.outgoing] == [0]
    assert done.incoming is not None
    assert done.incoming.bytes == 0
    assert asyncio.run(backend.state(job("a"))) is BackendState.PARKED
    assert asyncio.run(backend.state(job("b"))) is BackendState.RUNNING
    swap(backend, "b", "a")  # and back
    assert asyncio.run(backend.state(job("a"))) is BackendState.RUNNING
    assert asyncio.run(backend.state(job("b"))) is BackendState.PARKED


def test_a_swap_with_bytes_copies_in_worker_threads(backend: SimBackend, hops: list[Any]) -> None:
    a = sim.attach(job="a", node_dir=backend.node_dir).alloc(MiB, tag="weights")
    a[:] = b"a" * MiB
    b = sim.attach(job="b", node_dir=backend.node_dir).alloc(MiB, tag="weights")
    b[:] = b"b" * MiB
    asyncio.run(backend.snapshot(job("b"), deadline=time.time() + 30))
    hops.clear()
    done = swap(backend, "a", "b")
    assert len(hops) == 2  # the snapshot half and the restore half
    assert [o.bytes for o in done.outgoing] == [MiB]
    assert b.path.read_bytes() == b"b" * MiB
    swap(backend, "b", "a")
    assert a.path.read_bytes() == b"a" * MiB


def test_many_swaps_free_the_parked_copies_through_one_reaper_thread(
    backend: SimBackend,
) -> None:
    for name in ("a", "b"):
        sim.attach(job=name, node_dir=backend.node_dir).alloc(4096, tag="weights")
    asyncio.run(backend.snapshot(job("b"), deadline=time.time() + 30))
    before = threading.active_count()
    for _ in range(10):
        swap(backend, "a", "b")
        swap(backend, "b", "a")
    reapers = [t for t in threading.enumerate() if t.name == "rlslice-sim-reaper"]
    assert len(reapers) == 1
    assert threading.active_count() <= before + 1
    parked = backend.node_dir / "parked"
    deadline = time.monotonic() + 10
    while any(p.name.startswith(".trash-") for p in parked.iterdir()):  # freed in the back
        assert time.monotonic() < deadline, sorted(p.name for p in parked.iterdir())
        time.sleep(0.01)
    assert sorted(p.name for p in parked.iterdir()) == ["b"]
