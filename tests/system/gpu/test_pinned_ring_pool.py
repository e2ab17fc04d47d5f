"""The node's pinned pool of the `cuda` backend's custom-storage ring (fake driver).

Case matrix:
- a limit: a move gets no more buffers than the limit holds (a smaller ring), and the bytes
  still come back identical; the gauge shows what the pool holds
- reuse across switches: after the first move, later moves of other jobs pin nothing new
- the guard: growth stops where pinned + still-to-be-parked bytes would eat the reserve;
  idle buffers are evicted once host memory is below the reserve
- two leases at the limit: the second waits for the first (or times out, saying why) and
  then reuses its buffers
- pinned_refusal, the guard's rule
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import rlslice_gpu_fakes as fakes
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlslice.snapshot_agent import memguard
from rlslice.snapshot_agent.backends import _ring
from rlslice.snapshot_agent.backends._nvml import Nvml
from rlslice.snapshot_agent.backends.base import BackendContext, JobHandle
from rlslice.snapshot_agent.backends.cuda import CudaBackend
from rlslice.snapshot_agent.metrics import AgentMetrics

CHUNK = 4096
GiB = 1 << 30


def make(
    tmp_path: Path, driver: fakes.FakeCustomDriver, host: list[int], **options: str
) -> CudaBackend:
    """Host memory available is host[0] less what the driver has pinned."""
    options = {
        "chunk_bytes": str(CHUNK),
        "ring_buffers": "4",
        "store_dir": str(tmp_path / "store"),
        "host_reserve_bytes": str(GiB),
        **options,
    }
    nvml = fakes.FakeNvml(
        dict.fromkeys(driver.procs, GiB), parked=lambda pid: driver.procs.get(pid) is fakes.C
    )
    context = BackendContext(node="n1", state_dir=tmp_path / "state", options=options)
    return CudaBackend(
        context,
        driver=driver,
        nvml=Nvml(nvml),
        host_memory=lambda: host[0] - len(driver.pinned) * CHUNK,
    )


def job(pid: int) -> JobHandle:
    return JobHandle(job=f"job-{pid}", group="g", pids=(pid,))


def soon() -> float:
    return time.time() + 30


def hosts(driver: fakes.FakeCustomDriver) -> set[int]:
    return {entry[-1] for entry in driver.log if entry[0] in ("d2h", "h2d")}


async def test_a_move_gets_no_more_pinned_buffers_than_the_limit_holds(tmp_path: Path) -> None:
    original = [bytes(range(256)) * 40]  # 10240 bytes: 3 chunks
    driver = fakes.FakeCustomDriver({11: original})
    backend = make(tmp_path, driver, [64 * GiB], pinned_pool_bytes=str(2 * CHUNK))
    await backend.snapshot(job(11), deadline=soon())
    assert len(hosts(driver)) == 2  # a ring of two, not the four asked for
    assert driver.pin_calls == 2
    assert backend.pinned_total() == 2 * CHUNK
    await backend.restore(job(11), deadline=soon())
    assert driver.contents(11) == original
    metrics = AgentMetrics("n1")
    metrics.pinned_bytes.set(backend.pinned_total())  # what the engine does on refresh
    text = generate_latest(metrics.registry).decode()
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "rlslice_agent_pinned_bytes"
    ]
    assert family.samples[0].value == 2 * CHUNK


async def test_later_switches_reuse_the_pinned_buffers(tmp_path: Path) -> None:
    driver = fakes.FakeCustomDriver({11: [b"a" * 5 * CHUNK], 12: [b"b" * 7 * CHUNK]})
    backend = make(tmp_path, driver, [64 * GiB])
    await backend.snapshot(job(11), deadline=soon())
    first = hosts(driver)
    for _ in range(2):  # switch to 12 and back
        await backend.snapshot(job(12), deadline=soon())
        await backend.restore(job(11), deadline=soon())
        await backend.snapshot(job(11), deadline=soon())
        await backend.restore(job(12), deadline=soon())
    assert driver.pin_calls == 4
    assert hosts(driver) == first
    assert driver.contents(12) == [b"b" * 7 * CHUNK]


async def test_the_pool_grows_only_while_pinned_and_parked_bytes_leave_the_reserve(
    tmp_path: Path,
) -> None:
    size = 8 * CHUNK
    host = [GiB + size + 2 * CHUNK]  # the reserve, the bytes to park, and two buffers
    driver = fakes.FakeCustomDriver({11: [b"c" * size]})
    backend = make(tmp_path, driver, host)
    await backend.snapshot(job(11), deadline=soon())
    assert driver.pin_calls == 2
    host[0] = GiB - 1  # host memory now below the reserve: idle buffers go back
    await backend.restore(job(11), deadline=soon())
    assert backend.pinned_total() == 0
    assert driver.pinned == {}
    assert backend.pool.evictions == 2


class CountingCopier:
    def __init__(self) -> None:
        self.allocated: list[int] = []
        self.freed: list[int] = []

    def alloc_host(self, nbytes: int) -> int:
        self.allocated.append(len(self.allocated) + 1)
        return self.allocated[-1]

    def free_host(self, pointer: int) -> None:
        self.freed.append(pointer)


def test_a_lease_at_the_limit_waits_for_buffers_to_come_back_and_reuses_them() -> None:
    pool = _ring.PinnedPool(limit=3 * CHUNK, chunk=CHUNK, reserve=0, host_available=lambda: GiB)
    copier = CountingCopier()
    with pool.lease(3, copier, timeout=1) as first:  # type: ignore[arg-type]
        with (
            pytest.raises(TimeoutError, match="at its limit"),
            pool.lease(3, copier, timeout=0),  # type: ignore[arg-type]
        ):
            pass
        got: list[list[int]] = []
        started = threading.Event()

        def second() -> None:
            started.set()
            with pool.lease(3, copier, timeout=10) as buffers:  # type: ignore[arg-type]
                got.append(list(buffers))

        thread = threading.Thread(target=second)
        thread.start()
        started.wait()
    thread.join(10)
    assert sorted(got[0]) == sorted(first)
    assert copier.allocated == [1, 2, 3]
    assert pool.total_bytes == 3 * CHUNK


@pytest.mark.parametrize(
    ("extra", "pending", "available", "refused"),
    [(GiB, 0, 3 * GiB, False), (GiB, GiB, 3 * GiB, False), (GiB, GiB + 1, 3 * GiB, True)],
)
def test_pinned_refusal_counts_the_bytes_still_being_parked(
    extra: int, pending: int, available: int, refused: bool
) -> None:
    reason = memguard.pinned_refusal(extra, host_available=available, reserve=GiB, pending=pending)
    assert (reason is not None) is refused
    if reason:
        assert "reserve of 1.00 GiB" in reason
