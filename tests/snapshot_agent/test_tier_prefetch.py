"""Prefetching a waiter's spilled parts into host memory, through a real agent (`sim`
backend, real job processes, spill files on a real disk folder).

Four jobs of 8 MiB, a host budget of two: job-a runs; job-b, job-c, job-d park in that
order, so job-b (the oldest) goes to disk.

Case matrix:

| case | expected |
|---|---|
| Prefetch of the spilled job-b | its 8 MiB read back into host memory (a fill), job-c (least recently used of the others) spilled for room; the answer's tier moves say both |
| then a Switch from job-a to job-b | the restore reads no disk bytes: no fill in the answer, the fill counter unchanged; job-d, not job-b, spilled for job-a's park; job-b's bytes identical |
| Prefetch of a job with nothing on disk | moves nothing, says so (0 bytes, no tier moves) |
| Prefetch of a job whose spill file is torn | ABORTED naming the file; the job stays parked (its restore faults so, as without a prefetch) |
| Prefetch that would leave host memory below the reserve | refused RESOURCE_EXHAUSTED naming the reserve; the job's parts stay on disk and restore identical |
| live, with a scheduler (headroom: no waiter fits beside the holder): a, b, c park in turn, a spills; a waits while d holds | the scheduler's skipped prefetch has the agent fill a into host memory before d yields; a's grant restores it with no disk read, bytes identical; the ring holds SPILL_DONE and one FILL_DONE for a (node in detail), on the timeline's `[spill]` lane |
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.adapters.channel import open_channel
from rlslice.apps.timeline.command import fetch_events
from rlslice.apps.timeline.trace_export import SPILL_LANE, build_timeline
from rlslice.client import AsyncClient
from rlslice.config import GroupSpec
from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.snapshot_agent import AgentSettings, RunningAgent, start_agent
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import MiB, eventually

SIZE = 8 * MiB
JOBS = ["job-a", "job-b", "job-c", "job-d"]
TIER_KINDS = ("SPILL_DONE", "FILL_DONE")


@pytest.fixture
def tiered(make_settings: Callable[..., AgentSettings], tmp_path: Path) -> AgentSettings:
    return make_settings(
        "n4",
        host_budget_bytes=2 * SIZE,
        spill_dir=tmp_path / "spill",
        sim={"capacity_bytes": 64 * MiB},
    )


@pytest.fixture
async def served(tiered: AgentSettings) -> AsyncIterator[tuple[RunningAgent, Any]]:
    """A running agent on `tiered` settings, and a stub on its port."""
    agent = await start_agent(tiered)
    channel = open_channel(agent.address, token=agent.token)
    try:
        yield agent, agent_pb2_grpc.AgentStub(channel)
    finally:
        await channel.close(None)
        await agent.stop(0)


async def _parked(stub: Any, spawn_job: Callable[..., Any], agent: RunningAgent) -> dict[str, Any]:
    jobs = {}
    for seed, name in enumerate(JOBS):
        jobs[name] = await spawn_job(name, "g1", SIZE, "--seed", str(seed), running=agent)
    for epoch, name in enumerate(JOBS[1:], start=1):
        await stub.Snapshot(apb.SnapshotRequest(job=name, group="g1", epoch=epoch))
    assert agent.engine.tiering.spilled("job-b")
    return jobs


def _moves(moves: Any) -> list[tuple[str, str, int]]:
    return [(m.job, m.direction, m.bytes) for m in moves]


def _filled(agent: RunningAgent) -> float:
    value = agent.metrics.registry.get_sample_value(
        "rlslice_agent_tier_moved_bytes_total", {"direction": "fill"}
    )
    return value or 0.0


async def test_a_prefetched_waiter_restores_without_reading_the_disk(
    served: tuple[RunningAgent, Any], spawn_job: Callable[..., Any]
) -> None:
    agent, stub = served
    jobs = await _parked(stub, spawn_job, agent)
    result = await stub.Prefetch(apb.PrefetchRequest(job="job-b", group="g1"))
    assert result.filled_bytes == SIZE
    assert _moves(result.tier_moves) == [("job-c", "spill", SIZE), ("job-b", "fill", SIZE)]
    assert not agent.engine.tiering.spilled("job-b")
    filled = _filled(agent)
    assert filled == SIZE

    switch = await stub.Switch(
        apb.SwitchRequest(
            group="g1",
            epoch=10,
            outgoing=[apb.SwitchMove(job="job-a")],
            incoming=apb.SwitchMove(job="job-b"),
        ),
        timeout=60,
    )
    assert not switch.HasField("failure"), switch.failure.reason
    moved = _moves(switch.incoming.tier_moves)
    assert moved == [("job-d", "spill", SIZE)]  # room for job-a; job-b stays in DRAM
    assert _filled(agent) == filled  # the restore read no disk bytes
    assert (await jobs["job-b"].ask("hash"))["hash"] == jobs["job-b"].info["hash"]


async def test_a_prefetch_of_a_job_with_nothing_on_disk_moves_nothing(
    served: tuple[RunningAgent, Any], spawn_job: Callable[..., Any]
) -> None:
    agent, stub = served
    await _parked(stub, spawn_job, agent)
    result = await stub.Prefetch(apb.PrefetchRequest(job="job-d", group="g1"))
    assert result.filled_bytes == 0
    assert list(result.tier_moves) == []
    assert agent.engine.tiering.spilled("job-b")


async def test_a_prefetch_below_the_reserve_is_refused_and_keeps_the_parts_on_disk(
    served: tuple[RunningAgent, Any],
    spawn_job: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent, stub = served
    jobs = await _parked(stub, spawn_job, agent)
    # Host memory held still (spilling frees none of it, whatever /tmp is), and a
    # reserve that leaves room for half the part only.
    monkeypatch.setattr(agent.engine, "_host_memory", lambda: 64 * MiB)
    monkeypatch.setattr(agent.engine, "_reserve", 64 * MiB - SIZE // 2)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Prefetch(apb.PrefetchRequest(job="job-b", group="g1"))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "reserve" in (refused.value.details() or "")
    assert agent.engine.tiering.spilled("job-b")
    monkeypatch.undo()
    await stub.Restore(apb.RestoreRequest(job="job-b", group="g1", epoch=10))
    assert (await jobs["job-b"].ask("hash"))["hash"] == jobs["job-b"].info["hash"]


async def test_a_prefetch_of_a_torn_spill_file_is_aborted_naming_it_and_the_job_stays_parked(
    tiered: AgentSettings,
    served: tuple[RunningAgent, Any],
    spawn_job: Callable[..., Any],
) -> None:
    agent, stub = served
    await _parked(stub, spawn_job, agent)
    assert tiered.spill_dir is not None
    (torn,) = sorted((tiered.spill_dir / tiered.node / "job-b").glob("*.bin"))
    os.truncate(torn, SIZE // 2)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Prefetch(apb.PrefetchRequest(job="job-b", group="g1"))
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert f"spill file {torn} is torn" in (caught.value.details() or "")
    status = await stub.Status(apb.AgentStatusRequest())
    (job_b,) = [j for j in status.jobs if j.job == "job-b"]
    assert job_b.state == apb.AGENT_JOB_STATE_PARKED


async def _ring(scheduler: Any) -> list[Any]:
    return await fetch_events(scheduler.address, "g1")


async def test_the_scheduler_prefetches_a_spilled_waiter_and_the_ring_has_its_tier_moves(
    make_settings: Callable[..., AgentSettings], tmp_path: Path, spawn_job: Callable[..., Any]
) -> None:
    scheduler = await start_scheduler(
        SchedulerSettings(
            address="127.0.0.1:0",
            # A headroom larger than the device: no waiter ever fits beside the holder.
            groups=(GroupSpec(name="g1", backend="sim", headroom_bytes=128 * MiB),),
        )
    )
    settings = make_settings(
        "n5",
        host_budget_bytes=2 * SIZE,
        spill_dir=tmp_path / "spill",
        scheduler=scheduler.address,
    )
    agent = await start_agent(settings)
    clients = {job: AsyncClient(job=job, group="g1", scheduler=scheduler.address) for job in JOBS}
    try:
        await eventually(lambda: "n5" in scheduler.coordinator.agents)
        jobs = {}
        for seed, name in enumerate(JOBS):
            jobs[name] = await spawn_job(name, "g1", SIZE, "--seed", str(seed), running=agent)
        state = lambda: scheduler.engine.groups["g1"].state  # noqa: E731
        await clients["job-a"].acquire()
        for before, after in itertools.pairwise(JOBS):  # a, b, c park in turn; a spills
            waiting = asyncio.ensure_future(clients[after].acquire())
            await eventually(lambda after=after: [w.job for w in state().queue] == [after])
            await clients[before].yield_()
            await waiting
        assert agent.engine.tiering.spilled("job-a")
        back = asyncio.ensure_future(clients["job-a"].acquire())

        async def filled() -> bool:
            return any(e.kind == "FILL_DONE" for e in await _ring(scheduler))

        await eventually(filled, timeout=30)
        assert not agent.engine.tiering.spilled("job-a")
        fills = _filled(agent)
        await clients["job-d"].yield_()
        grant = await back
        assert grant.restored
        assert _filled(agent) == fills == SIZE  # the restore read nothing from disk
        assert (await jobs["job-a"].ask("hash"))["hash"] == jobs["job-a"].info["hash"]
        events = await _ring(scheduler)
    finally:
        for client in clients.values():
            await client.close()
        await agent.stop(0)
        await scheduler.stop(0)
    tier = [(e.kind, e.job, e.detail, e.bytes) for e in events if e.kind in TIER_KINDS]
    assert ("SPILL_DONE", "job-a", "n5", SIZE) in tier
    assert [t for t in tier if t[0] == "FILL_DONE"] == [("FILL_DONE", "job-a", "n5", SIZE)]
    timeline = build_timeline(events, "g1")
    lane = [i.name for i in timeline.intervals if i.lane.startswith(SPILL_LANE)]
    assert lane.count("fill job-a") == 1
    assert "spill job-a" in lane
