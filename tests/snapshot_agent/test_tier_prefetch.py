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
| Prefetch that would leave host memory below the reserve | refused RESOURCE_EXHAUSTED naming the reserve; the job's parts stay on disk and restore identical |
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.adapters.channel import open_channel
from rlslice.snapshot_agent import AgentSettings, RunningAgent, start_agent
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import MiB

SIZE = 8 * MiB
JOBS = ["job-a", "job-b", "job-c", "job-d"]


@pytest.fixture
def tiered(make_settings: Callable[..., AgentSettings], tmp_path: Path) -> AgentSettings:
    return make_settings(
        "n4",
        host_budget_bytes=2 * SIZE,
        spill_dir=tmp_path / "spill",
        sim={"capacity_bytes": 64 * MiB},
    )


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
    tiered: AgentSettings, spawn_job: Callable[..., Any]
) -> None:
    agent = await start_agent(tiered)
    channel = open_channel(agent.address, token=agent.token)
    stub = agent_pb2_grpc.AgentStub(channel)
    try:
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
    finally:
        await channel.close(None)
        await agent.stop(0)


async def test_a_prefetch_of_a_job_with_nothing_on_disk_moves_nothing(
    tiered: AgentSettings, spawn_job: Callable[..., Any]
) -> None:
    agent = await start_agent(tiered)
    channel = open_channel(agent.address, token=agent.token)
    stub = agent_pb2_grpc.AgentStub(channel)
    try:
        await _parked(stub, spawn_job, agent)
        result = await stub.Prefetch(apb.PrefetchRequest(job="job-d", group="g1"))
        assert result.filled_bytes == 0
        assert list(result.tier_moves) == []
        assert agent.engine.tiering.spilled("job-b")
    finally:
        await channel.close(None)
        await agent.stop(0)


async def test_a_prefetch_below_the_reserve_is_refused_and_keeps_the_parts_on_disk(
    tiered: AgentSettings, spawn_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await start_agent(tiered)
    channel = open_channel(agent.address, token=agent.token)
    stub = agent_pb2_grpc.AgentStub(channel)
    try:
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
    finally:
        await channel.close(None)
        await agent.stop(0)
