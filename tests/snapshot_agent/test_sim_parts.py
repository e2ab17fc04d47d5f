"""The `sim` backend moves tagged parts (issue 26): a buffer's part is its `alloc` tag.

Cases: a partial snapshot copies only the offload tags' buffers, frees the discard tags'
buffers without a copy and leaves the rest on the device; its restore copies back only
what it parked and grows the discarded buffers again, zero-filled; a snapshot without the
option moves every buffer, as before; a partial handle's device bytes are those it would
copy (the host-memory guard's ask); an agent restart (`state`) keeps the parts a partial
snapshot left on the device; a swap with a partial half runs one move after the other.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from rlslice.client import sim
from rlslice.config import OFFLOAD_TAGS_OPTION
from rlslice.snapshot_agent.backends.base import BackendContext, BackendState, JobHandle
from rlslice.snapshot_agent.backends.sim import SimBackend

MiB = 1 << 20


@pytest.fixture
def backend(shm_root: Path, tmp_path: Path) -> SimBackend:
    options = {"root": str(shm_root), "capacity_bytes": str(64 * MiB)}
    return SimBackend(BackendContext(node="n1", state_dir=tmp_path, options=options))


def job(name: str, offload: str | None = None, discard: tuple[str, ...] = ()) -> JobHandle:
    options = {} if offload is None else {OFFLOAD_TAGS_OPTION: offload}
    return JobHandle(job=name, group="g", pids=(), options=options, discard_tags=discard)


def allocate(backend: SimBackend, name: str) -> dict[str, sim.SimBuffer]:
    device = sim.attach(job=name, node_dir=backend.node_dir)
    buffers = {}
    for tag, fill in (("weights", b"w"), ("optimizer", b"o"), ("kv_cache", b"k")):
        buffers[tag] = device.alloc(4 * MiB, tag=tag)
        buffers[tag][:] = fill * (4 * MiB)
    return buffers


def sizes(buffers: dict[str, sim.SimBuffer]) -> dict[str, int]:
    return {tag: b.path.stat().st_size for tag, b in buffers.items()}


def deadline() -> float:
    return time.time() + 30


def test_a_partial_snapshot_moves_only_the_chosen_parts_and_restores_only_those(
    backend: SimBackend,
) -> None:
    buffers = allocate(backend, "a")
    handle = job("a", "optimizer", ("kv_cache",))
    assert asyncio.run(backend.device_bytes(handle)) == 4 * MiB  # what the park takes
    out = asyncio.run(backend.snapshot(handle, deadline=deadline()))
    assert out.bytes == 4 * MiB  # the optimizer only: the kv_cache is freed, not copied
    assert sizes(buffers) == {"weights": 4 * MiB, "optimizer": 0, "kv_cache": 0}
    assert asyncio.run(backend.device_bytes(job("a"))) == 4 * MiB  # the weights stay
    back = asyncio.run(backend.restore(handle, deadline=deadline()))
    assert back.bytes == 4 * MiB
    assert sizes(buffers) == dict.fromkeys(buffers, 4 * MiB)
    assert buffers["optimizer"].path.read_bytes() == b"o" * (4 * MiB)
    assert buffers["weights"].path.read_bytes() == b"w" * (4 * MiB)
    assert buffers["kv_cache"].path.read_bytes() == bytes(4 * MiB)  # to rebuild


def test_a_snapshot_without_the_option_moves_every_part(backend: SimBackend) -> None:
    buffers = allocate(backend, "a")
    out = asyncio.run(backend.snapshot(job("a", discard=("kv_cache",)), deadline=deadline()))
    assert out.bytes == 12 * MiB
    assert set(sizes(buffers).values()) == {0}
    asyncio.run(backend.restore(job("a"), deadline=deadline()))
    assert buffers["kv_cache"].path.read_bytes() == b"k" * (4 * MiB)


def test_an_agent_restart_keeps_the_parts_a_partial_snapshot_left(backend: SimBackend) -> None:
    buffers = allocate(backend, "a")
    asyncio.run(backend.snapshot(job("a", "optimizer"), deadline=deadline()))
    assert asyncio.run(backend.state(job("a"))) is BackendState.PARKED
    assert sizes(buffers) == {"weights": 4 * MiB, "optimizer": 0, "kv_cache": 4 * MiB}


def test_a_swap_with_a_partial_half_moves_one_after_the_other(backend: SimBackend) -> None:
    a = allocate(backend, "a")
    b = allocate(backend, "b")
    asyncio.run(backend.snapshot(job("b"), deadline=deadline()))
    done = asyncio.run(
        backend.swap([job("a", "", ("kv_cache",))], job("b"), headroom_bytes=0, deadline=deadline())
    )
    assert done.overlapped is False
    assert [o.bytes for o in done.outgoing] == [0]
    assert done.incoming is not None
    assert done.incoming.bytes == 12 * MiB
    assert sizes(a) == {"weights": 4 * MiB, "optimizer": 4 * MiB, "kv_cache": 0}
    assert b["weights"].path.read_bytes() == b"w" * (4 * MiB)
