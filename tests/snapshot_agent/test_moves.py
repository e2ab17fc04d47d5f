"""Snapshot and restore through a real agent on loopback, with real job processes.

Case matrix:
- snapshot: every process of the job (children too) stopped ('T'), device memory freed,
  bytes reported; restore: resumed, bytes identical (sha256), device memory back
- a switch: one job parked, another restored, on one emulated device
- epochs: the same call twice -> repeated, acted once; an older epoch -> FAILED_PRECONDITION
- absent: a job unknown here, or whose processes all exited -> absent=True
- restore of a running job -> FAILED_PRECONDITION; release of an unknown job -> NOT_FOUND
- bad input (ids, negative epoch) -> INVALID_ARGUMENT and nothing changes
- host-memory guard -> RESOURCE_EXHAUSTED, the job keeps running
- a restore that finds the device full -> RESOURCE_EXHAUSTED, the job stays parked
- the copy rate paces the move
- release: kept while the job lives unless forced; frees the parked copy
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from rlslice.snapshot_agent import AgentSettings, start_agent
from rlslice.v1alpha1 import agent_pb2 as apb

from .conftest import MiB, eventually, proc_state

PARKED = apb.AGENT_JOB_STATE_PARKED
RUNNING = apb.AGENT_JOB_STATE_RUNNING
FAULTED = apb.AGENT_JOB_STATE_FAULTED


def snap(job: str, epoch: int, group: str = "g1") -> apb.SnapshotRequest:
    return apb.SnapshotRequest(job=job, group=group, epoch=epoch)


def rest(job: str, epoch: int, group: str = "g1") -> apb.RestoreRequest:
    return apb.RestoreRequest(job=job, group=group, epoch=epoch)


async def job_status(stub: Any, job: str) -> apb.AgentJob | None:
    status = await stub.Status(apb.AgentStatusRequest())
    return next((j for j in status.jobs if j.job == job), None)


async def device_used(stub: Any) -> int:
    status = await stub.Status(apb.AgentStatusRequest())
    return sum(d.used_bytes for d in status.devices)


async def test_a_snapshot_freezes_the_job_frees_the_device_and_a_restore_brings_the_same_bytes(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    job = await spawn_job("job-a", "g1", 8 * MiB, "--spawn-child")
    child = job.info["child"]
    before = job.info["hash"]
    assert await device_used(stub) == 8 * MiB

    result = await stub.Snapshot(snap("job-a", 1))
    assert (result.state, result.bytes, result.repeated, result.absent) == (
        PARKED,
        8 * MiB,
        False,
        False,
    )
    assert result.backend == "sim"
    assert result.epoch == 1
    assert proc_state(job.pid) == "T"
    assert proc_state(child) == "T"  # descendants are part of the job
    assert await device_used(stub) == 0
    entry = await job_status(stub, "job-a")
    assert entry is not None
    assert entry.state == PARKED
    assert entry.host_bytes == 8 * MiB
    assert set(entry.pids) == {job.pid, child}

    result = await stub.Restore(rest("job-a", 2))
    assert (result.state, result.bytes) == (RUNNING, 8 * MiB)
    assert proc_state(job.pid) in ("S", "R")
    assert proc_state(child) in ("S", "R")
    assert await device_used(stub) == 8 * MiB
    assert (await job.ask("hash"))["hash"] == before


async def test_a_switch_parks_one_job_and_restores_another_on_a_shared_device(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    a = await spawn_job("job-a", "g1", 24 * MiB, "--seed", "1")
    b = await spawn_job("job-b", "g1", 24 * MiB, "--seed", "2")
    await stub.Snapshot(snap("job-b", 1))
    # 64 MiB device: a third job of 24 MiB fits only while b is parked.
    for epoch in range(2, 6):
        out, into = (a, b) if epoch % 2 == 0 else (b, a)
        names = {a: "job-a", b: "job-b"}
        await stub.Snapshot(snap(names[out], epoch))
        await stub.Restore(rest(names[into], epoch))
        assert proc_state(out.pid) == "T"
        assert proc_state(into.pid) in ("S", "R")
        assert (await into.ask("hash"))["hash"] == into.info["hash"]


async def test_a_repeated_call_with_the_same_epoch_is_answered_without_acting_twice(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    await spawn_job("job-a", "g1", 4 * MiB)
    first = await stub.Snapshot(snap("job-a", 7))
    again = await stub.Snapshot(snap("job-a", 7))
    assert again.repeated
    assert not first.repeated
    assert (again.bytes, again.seconds, again.state) == (first.bytes, first.seconds, first.state)
    restored = await stub.Restore(rest("job-a", 8))
    assert (await stub.Restore(rest("job-a", 8))).repeated
    assert restored.state == RUNNING


async def test_a_call_with_an_older_epoch_is_refused_and_changes_nothing(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    job = await spawn_job("job-a", "g1", 4 * MiB)
    await stub.Snapshot(snap("job-a", 5))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Restore(rest("job-a", 4))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "epoch" in (caught.value.details() or "")
    assert proc_state(job.pid) == "T"
    entry = await job_status(stub, "job-a")
    assert entry is not None
    assert entry.state == PARKED
    assert entry.epoch == 5


async def test_a_snapshot_of_a_job_with_no_process_here_answers_absent(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    result = await stub.Snapshot(snap("nobody", 1))
    assert result.absent
    assert result.bytes == 0
    restore = await stub.Restore(rest("nobody", 1))
    assert restore.absent


async def test_a_restore_of_a_job_that_is_not_parked_fails_its_precondition(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    job = await spawn_job("job-a", "g1", 4 * MiB)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Restore(rest("job-a", 1))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not parked" in (caught.value.details() or "")
    assert proc_state(job.pid) in ("S", "R")


async def test_a_release_of_an_unknown_job_is_not_found(stub: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Release(apb.ReleaseRequest(job="nobody", group="g1"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (snap("Bad_Id", 1), "job"),
        (snap("job-a", 1, group=""), "group"),
        (snap("job-a", -1), "epoch"),
        (apb.SnapshotRequest(job="job-a", group="g1", epoch=1, backend="nope"), "backend"),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    stub: Any, spawn_job: Callable[..., Any], request_: apb.SnapshotRequest, field: str
) -> None:
    job = await spawn_job("job-a", "g1", 4 * MiB)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Snapshot(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(field)
    assert proc_state(job.pid) in ("S", "R")
    entry = await job_status(stub, "job-a")
    assert entry is not None
    assert entry.state == RUNNING
    assert entry.epoch == 0


async def test_a_snapshot_host_memory_cannot_take_is_refused_and_the_job_keeps_running(
    make_settings: Callable[..., AgentSettings], spawn_job: Callable[..., Any]
) -> None:
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import agent_pb2_grpc

    greedy = await start_agent(make_settings("n2", host_reserve_bytes=1 << 50))
    channel = open_channel(greedy.address, token=greedy.token)
    try:
        stub = agent_pb2_grpc.AgentStub(channel)
        job = await spawn_job("job-a", "g1", 4 * MiB, running=greedy)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Snapshot(snap("job-a", 1))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "host memory" in (caught.value.details() or "")
        assert proc_state(job.pid) in ("S", "R")
        entry = await job_status(stub, "job-a")
        assert entry is not None
        assert entry.state == RUNNING
        assert entry.device_bytes == 4 * MiB
        assert (await job.ask("hash"))["hash"] == job.info["hash"]
    finally:
        await channel.close(None)
        await greedy.stop(0)


async def test_a_restore_into_a_full_device_is_refused_and_the_job_stays_parked(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    a = await spawn_job("job-a", "g1", 40 * MiB)
    await stub.Snapshot(snap("job-a", 1))
    b = await spawn_job("job-b", "g1", 40 * MiB)  # takes the room a left
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Restore(rest("job-a", 2))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "out of memory" in (caught.value.details() or "")
    assert proc_state(a.pid) == "T"
    entry = await job_status(stub, "job-a")
    assert entry is not None
    assert entry.state == FAULTED
    assert entry.host_bytes == 40 * MiB
    # Once b is parked, the retry succeeds and clears the fault.
    await stub.Snapshot(snap("job-b", 3))
    result = await stub.Restore(rest("job-a", 3))
    assert result.state == RUNNING
    assert (await a.ask("hash"))["hash"] == a.info["hash"]
    assert proc_state(b.pid) == "T"


async def test_the_copy_rate_paces_a_move(
    make_settings: Callable[..., AgentSettings], spawn_job: Callable[..., Any]
) -> None:
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import agent_pb2_grpc

    slow = await start_agent(make_settings("n2", sim={"rate_gbps": 0.2, "overhead_seconds": 0.05}))
    channel = open_channel(slow.address, token=slow.token)
    try:
        stub = agent_pb2_grpc.AgentStub(channel)
        await spawn_job("job-a", "g1", 20_000_000, running=slow)
        result = await stub.Snapshot(snap("job-a", 1))
        # 20 MB at 0.2 GB/s is 0.1 s, plus 0.05 s of overhead.
        assert result.seconds >= 0.15
    finally:
        await channel.close(None)
        await slow.stop(0)


async def test_release_keeps_a_live_jobs_state_unless_forced_and_frees_the_parked_copy(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    job = await spawn_job("job-a", "g1", 4 * MiB)
    await stub.Snapshot(snap("job-a", 1))
    kept = await stub.Release(apb.ReleaseRequest(job="job-a", group="g1"))
    assert not kept.released
    assert kept.freed_bytes == 0
    assert (await job_status(stub, "job-a")) is not None
    job.kill()
    await asyncio.wait_for(job.process.wait(), 5)

    # The scheduler released the job already: once its processes are gone, the agent
    # frees the parked copy by itself (the scheduler does not ask twice).
    async def gone() -> bool:
        return await job_status(stub, "job-a") is None

    await eventually(gone)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Release(apb.ReleaseRequest(job="job-a", group="g1"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_parked_job_never_released_keeps_its_copy_after_its_processes_exit(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    job = await spawn_job("job-a", "g1", 4 * MiB)
    await stub.Snapshot(snap("job-a", 1))
    job.kill()
    await asyncio.wait_for(job.process.wait(), 5)
    await asyncio.sleep(0.2)
    assert (await job_status(stub, "job-a")) is not None
    freed = await stub.Release(apb.ReleaseRequest(job="job-a", group="g1"))
    assert freed.released
    assert freed.freed_bytes == 4 * MiB
    assert (await job_status(stub, "job-a")) is None


async def test_a_job_whose_processes_exited_is_absent_and_its_memory_freed(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    job = await spawn_job("job-a", "g1", 4 * MiB)
    assert await device_used(stub) == 4 * MiB
    job.kill()
    await asyncio.wait_for(job.process.wait(), 5)

    async def gone() -> bool:
        return await job_status(stub, "job-a") is None

    await eventually(gone)
    assert await device_used(stub) == 0
    assert (await stub.Snapshot(snap("job-a", 1))).absent
