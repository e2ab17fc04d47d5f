"""A partial snapshot (the `offload_tags` option) is refused FAILED_PRECONDITION, before
anything moves, by a backend that cannot split a job into parts (`cuda` and
`cuda-checkpoint` move whole processes); `sim` and `app` take it (`app`'s partial moves:
tests/system/gpu/test_app_parts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from rlslice.config import OFFLOAD_TAGS_OPTION
from rlslice.snapshot_agent import AgentSettings, RunningAgent, start_agent
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import MiB, proc_state


@pytest.fixture
async def agent(make_settings: Callable[..., AgentSettings]) -> Any:
    running = await start_agent(make_settings("n3", sim={"capacity_bytes": 40 * MiB}))
    yield running
    await running.stop(0)


@pytest.fixture
async def stub(agent: RunningAgent) -> Any:
    from rlslice.adapters.channel import open_channel

    channel = open_channel(agent.address, token=agent.token)
    yield agent_pb2_grpc.AgentStub(channel)
    await channel.close(None)


async def test_a_backend_that_moves_whole_processes_refuses_a_partial_snapshot(
    agent: RunningAgent, stub: Any, spawn_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlslice.snapshot_agent.backends.sim import SimBackend

    job = await spawn_job("job-a", "g1", 4 * MiB, running=agent)
    partial = {OFFLOAD_TAGS_OPTION: ""}
    monkeypatch.setattr(SimBackend, "splits_parts", False)  # as cuda and cuda-checkpoint
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Snapshot(apb.SnapshotRequest(job="job-a", group="g1", epoch=1, options=partial))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "moves whole processes" in (raised.value.details() or "")
    assert proc_state(job.pid) != "T"
    monkeypatch.undo()
    done = await stub.Snapshot(
        apb.SnapshotRequest(job="job-a", group="g1", epoch=1, options=partial)
    )
    assert done.state == apb.AGENT_JOB_STATE_PARKED
    assert done.bytes == 0  # no tag chosen: nothing copied, every part left on the device


def test_only_the_backends_that_move_by_tag_split_a_job_into_parts() -> None:
    from importlib.metadata import entry_points

    splits = {
        entry.name: entry.load().splits_parts for entry in entry_points(group="rlslice.backends")
    }
    assert splits == {"sim": True, "app": True, "cuda": False, "cuda-checkpoint": False}
