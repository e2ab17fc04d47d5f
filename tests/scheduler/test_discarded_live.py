"""`Grant.discarded` through a real scheduler, a real sim agent and two clients (issue 26).

Two sim jobs of four tagged 1 MiB parts take turns on a node whose device holds one job
and a little over three quarters of the other, so each switch must free one part of the
outgoing job. job-a declared its `p0` part `discard`; job-b declared nothing discardable.
Cases, turn by turn:

| switch | what moves | the grant | GetGroup while parked |
|---|---|---|---|
| a -> b | a's `p0` discarded | b: `discarded` () (never parked) | a: discarded_parts [p0], parked_parts [] |
| b -> a | b's `p3` offloaded | a: `discarded` ("p0",) | b: parked_parts [p3], discarded_parts []; a (holding): discarded_parts [p0], told |
| a -> b | a's `p0` discarded again | b: `discarded` () (it offloaded, never discarded) | - |

A grant tells the job once; while the job holds, GetGroup still lists what its grant told
(a client that lost the answer reads it back there).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlslice.adapters.channel import open_channel
from rlslice.apps.bench._switch_duplex import _agent, _options, stop_jobs
from rlslice.apps.bench._switch_partial import _spawn
from rlslice.client import AsyncClient
from rlslice.config import GroupSpec, JobSpec, MoveClass, StatePart
from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

MiB = 1 << 20
PART = MiB
SIZE = 4 * PART


@pytest.fixture
def folders() -> Iterator[tuple[Path, Path]]:
    """The emulated devices' root (shared memory) and a short folder for the sockets."""
    root = Path(
        tempfile.mkdtemp(
            prefix="rlslice-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
    )
    work = Path(tempfile.mkdtemp(prefix="rd-", dir="/tmp"))
    yield root, work
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


def _parts(discard_first: bool) -> tuple[StatePart, ...]:
    def move_class(i: int) -> MoveClass:
        return MoveClass.DISCARD if discard_first and i == 0 else MoveClass.OFFLOAD

    return tuple(
        StatePart(tag=f"p{i}", bytes=PART, move_class=move_class(i), need_order=i) for i in range(4)
    )


def _job(status: pb.GroupStatus, job: str) -> pb.JobStatus:
    return next(j for j in status.jobs if j.job == job)


async def test_a_parked_jobs_next_grant_names_the_parts_its_switch_discarded(
    folders: tuple[Path, Path],
) -> None:
    root, work = folders
    spec = GroupSpec(
        name="bench",
        jobs=(
            JobSpec(name="job-a", parts=_parts(discard_first=True)),
            JobSpec(name="job-b", parts=_parts(discard_first=False)),
        ),
    )
    scheduler = await start_scheduler(SchedulerSettings(address="127.0.0.1:0"))
    procs: list[Any] = []
    try:
        scheduler.engine.put_group(spec)
        capacity = SIZE + 3 * PART + PART // 4
        async with _agent("n1", capacity, _options(SIZE, 1.0, 0.0), root, work) as agent:
            channel = open_channel(scheduler.address)
            stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
            try:
                await stub.RegisterAgent(
                    pb.RegisterAgentRequest(
                        node=agent.node, address=agent.address, backends=["sim"]
                    )
                )
                await _turns(scheduler.address, stub, agent, procs)
            finally:
                await channel.close(None)
                await stop_jobs(procs)
    finally:
        await scheduler.stop(0)


async def _turns(address: str, stub: Any, agent: Any, procs: list[Any]) -> None:
    async def status() -> pb.GroupStatus:
        return await stub.GetGroup(pb.GetGroupRequest(group="bench"))

    def client(job: str) -> AsyncClient:
        return AsyncClient(job=job, group="bench", scheduler=address, device_bytes=SIZE)

    async with client("job-a") as a, client("job-b") as b:
        first = await a.acquire(timeout=60)
        assert first.discarded == ()
        procs.append(await _spawn(agent, "job-a", SIZE, 1))

        waiting = asyncio.ensure_future(b.acquire(timeout=60))
        await a.yield_()
        granted_b = await waiting
        assert granted_b.discarded == ()
        procs.append(await _spawn(agent, "job-b", SIZE, 2))
        shown = _job(await status(), "job-a")
        assert shown.state == pb.JOB_STATE_PARKED
        assert list(shown.discarded_parts) == ["p0"]
        assert list(shown.parked_parts) == []

        waiting = asyncio.ensure_future(a.acquire(timeout=60))
        await b.yield_()
        granted_a = await waiting
        assert granted_a.discarded == ("p0",)
        assert granted_a.moved_bytes > 0
        group = await status()
        assert list(_job(group, "job-a").discarded_parts) == ["p0"]
        shown = _job(group, "job-b")
        assert shown.state == pb.JOB_STATE_PARKED
        assert list(shown.parked_parts) == ["p3"]
        assert list(shown.discarded_parts) == []

        waiting = asyncio.ensure_future(b.acquire(timeout=60))
        await a.yield_()
        again_b = await waiting
        assert again_b.discarded == ()
        assert again_b.restored
