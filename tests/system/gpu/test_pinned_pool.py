"""Pinned staging kept between swaps as a bounded pool (CPU torch; no GPU needed).

Case matrix:
- no limit: every host buffer is kept after a restore and reused by the next offload
- a limit: buffers past it are freed after the restore, the next offload allocates again,
  and the bytes still come back identical
- a negative limit is refused
- the workload loop's answer carries the pinned bytes (one offloader, or several combined)
- the app backend notes what each job's workloads hold, lets the host-memory guard count
  it as taken already, sums it for the node's gauge, and forgets it at release
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rlslice._errors import InvalidArgumentError  # noqa: E402
from rlslice.client.offload import TorchOffloader  # noqa: E402
from rlslice.client.offload._serve import Combined, answer  # noqa: E402
from rlslice.snapshot_agent.backends.app import AppBackend  # noqa: E402
from rlslice.snapshot_agent.backends.base import BackendContext, JobHandle  # noqa: E402
from rlslice.v1alpha1 import agent_pb2  # noqa: E402

from .test_app_backend import InProcessLink  # noqa: E402

MiB = 1 << 20


def three_tensors() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.rand(MiB // 4, generator=generator) for _ in range(3)]  # 1 MiB each


def test_without_a_limit_every_buffer_is_kept_and_reused() -> None:
    tensors = three_tensors()
    offloader = TorchOffloader(device_type="cpu")
    offloader.register(tensors, "state")
    offloader.offload()
    assert offloader.pinned_bytes == 3 * MiB  # the parked copies
    offloader.restore()
    kept = {id(b) for buffers in offloader._pool.values() for b in buffers}
    assert offloader.pinned_bytes == 3 * MiB  # kept for the next swap
    offloader.offload()
    reused = {id(e.host) for e in offloader._parked}
    assert reused == kept


def test_a_limit_bounds_the_kept_pool_and_the_bytes_still_come_back() -> None:
    tensors = three_tensors()
    before = [t.clone() for t in tensors]
    offloader = TorchOffloader(device_type="cpu", pinned_limit_bytes=2 * MiB)
    offloader.register(tensors, "state")
    for _ in range(3):
        offloader.offload()
        assert offloader.pinned_bytes == 3 * MiB  # a parked copy is never cut short
        offloader.restore()
        assert offloader.pinned_bytes == 2 * MiB
        assert all(torch.equal(a, b) for a, b in zip(tensors, before, strict=True))
    nothing = TorchOffloader(device_type="cpu", pinned_limit_bytes=0)
    nothing.register(three_tensors(), "state")
    nothing.offload()
    nothing.restore()
    assert nothing.pinned_bytes == 0


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="pinned_limit_bytes"):
        TorchOffloader(device_type="cpu", pinned_limit_bytes=-1)


async def test_the_workload_loops_answer_carries_the_pinned_bytes() -> None:
    first, second = TorchOffloader(device_type="cpu"), TorchOffloader(device_type="cpu")
    first.register(three_tensors(), "a")
    second.register(three_tensors()[:1], "b")
    offload = agent_pb2.WorkloadCommand(
        command_id=1, action=agent_pb2.WorkloadCommand.ACTION_OFFLOAD
    )
    reply = await answer(first, offload)
    assert (reply.ok, reply.pinned_bytes) == (True, 3 * MiB)
    both = Combined([TorchOffloader(device_type="cpu"), second])
    reply = await answer(both, offload)
    assert reply.pinned_bytes == 1 * MiB


class PinnedLink(InProcessLink):
    """The in-process link, answering with the pinned bytes as the workload loop does."""

    async def command(self, action, *, epoch, discard_tags, timeout, offload_tags=None):  # type: ignore[no-untyped-def]
        found = await super().command(
            action,
            epoch=epoch,
            discard_tags=discard_tags,
            timeout=timeout,
            offload_tags=offload_tags,
        )
        from dataclasses import replace

        return replace(found, pinned_bytes=self.offloader.pinned_bytes)  # type: ignore[attr-defined]


async def test_the_app_backend_counts_what_each_jobs_workloads_hold(tmp_path: Path) -> None:
    backend = AppBackend(BackendContext(node="n1", state_dir=tmp_path))
    offloader = TorchOffloader(device_type="cpu")
    offloader.register(three_tensors(), "state")
    job = JobHandle(job="a", group="g", pids=(), workloads=(PinnedLink(offloader),))
    assert await backend.held_host_bytes(job) == 0
    await backend.snapshot(job, deadline=time.time() + 60)
    assert await backend.held_host_bytes(job) == 3 * MiB
    await backend.restore(job, deadline=time.time() + 60)
    assert await backend.held_host_bytes(job) == 3 * MiB  # the staging kept for next time
    assert backend.pinned_total() == 3 * MiB
    await backend.release(job)
    assert backend.pinned_total() == 0
