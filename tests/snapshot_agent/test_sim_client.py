"""`rlslice.client.sim`: emulated device memory as a job sees it.

Case matrix:
- a buffer is writable shared memory, visible as a file of its size, counted as used
- allocating beyond capacity raises SimOutOfMemoryError worded like CUDA's, allocates nothing
- free() gives the memory back
- bad sizes and missing devices fail with messages naming the problem
- the node folder comes from RLSLICE_SIM_ROOT + RLSLICE_NODE when not given
- the agent never waits past its deadline for a device lock a frozen job holds
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlslice.client import sim
from rlslice.snapshot_agent.backends.base import BackendContext
from rlslice.snapshot_agent.backends.sim import SimBackend

MiB = 1 << 20


@pytest.fixture
def node_dir(shm_root: Path, tmp_path: Path) -> Path:
    options = {"root": str(shm_root), "capacity_bytes": str(16 * MiB), "devices": "2"}
    SimBackend(BackendContext(node="n1", state_dir=tmp_path, options=options))
    return shm_root / "n1"


def test_a_buffer_is_writable_shared_memory_counted_against_the_device(node_dir: Path) -> None:
    device = sim.attach(job="job-a", node_dir=node_dir)
    buffer = device.alloc(4 * MiB, tag="weights")
    buffer[:4] = b"abcd"
    assert bytes(memoryview(buffer)[:4]) == b"abcd"
    assert buffer.path.stat().st_size == 4 * MiB
    assert buffer.path.read_bytes()[:4] == b"abcd"
    assert device.used_bytes() == 4 * MiB
    assert sim.attach(1, job="job-a", node_dir=node_dir).used_bytes() == 0
    buffer.free()
    assert device.used_bytes() == 0


def test_allocating_beyond_capacity_fails_like_cuda_and_allocates_nothing(node_dir: Path) -> None:
    device = sim.attach(job="job-a", node_dir=node_dir)
    kept = device.alloc(12 * MiB)
    with pytest.raises(sim.SimOutOfMemoryError) as caught:
        device.alloc(8 * MiB)
    message = str(caught.value)
    assert message.startswith("CUDA out of memory")
    assert "Tried to allocate" in message
    assert "GPU 0" in message
    assert isinstance(caught.value, MemoryError)
    assert device.used_bytes() == 12 * MiB
    kept.free()
    device.alloc(8 * MiB).free()


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_a_size_that_is_not_a_positive_integer_is_refused(node_dir: Path, size: object) -> None:
    device = sim.attach(job="job-a", node_dir=node_dir)
    with pytest.raises(ValueError, match="nbytes"):
        device.alloc(size)  # type: ignore[arg-type]


def test_attaching_where_no_agent_made_devices_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="sim backend"):
        sim.attach(job="job-a", node_dir=tmp_path)
    with pytest.raises(ValueError, match="job"):
        sim.attach(node_dir=tmp_path)


def test_the_node_folder_comes_from_the_environment(
    node_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSLICE_SIM_ROOT", str(node_dir.parent))
    monkeypatch.setenv("RLSLICE_NODE", "n1")
    monkeypatch.setenv("RLSLICE_JOB", "job-e")
    device = sim.attach(1)
    assert (device.node_dir, device.index, device.job) == (node_dir, 1, "job-e")
    assert device.total_bytes == 16 * MiB


def test_the_agent_gives_up_on_a_device_lock_a_stopped_job_still_holds(node_dir: Path) -> None:
    import fcntl
    import os
    import time

    from rlslice.snapshot_agent.backends import _simfs

    holder = os.open(node_dir / "d0.lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # as a job frozen in the middle of alloc() would
    try:
        started = time.monotonic()
        with (
            pytest.raises(TimeoutError, match="device 0"),
            _simfs.device_lock(node_dir, 0, time.time() + 0.2),
        ):
            pass
        assert time.monotonic() - started < 2
    finally:
        os.close(holder)
    with _simfs.device_lock(node_dir, 0, time.time() + 1):
        pass
