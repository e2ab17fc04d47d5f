"""The timeline names the parts a partial switch parked, from a live scheduler (issue 26).

A real scheduler, a real `sim` agent and two clients, set up as in
tests/scheduler/test_discarded_live.py: two sim jobs of four tagged 1 MiB parts on a node
whose device holds one job and a little over three quarters of the other, so each switch
frees one part of the outgoing job; job-a declared its `p0` part `discard`.

| switch | the ring's status after it | the timeline (from `GetEvents`) |
|---|---|---|
| -> job-a (the first grant) | no parts | `switch -> job-a`, as for a whole move |
| job-a -> job-b | job-a: discarded_parts [p0] | `switch job-a (discarded p0) -> job-b`, args `discarded_parts: p0`; the snapshot slice and an instant on job-a's lane say `discarded p0` |
| job-b -> job-a | job-b: parked_parts [p3] | `switch job-b (parked p3) -> job-a`, args `parked_parts: p3` |
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
from rlslice.apps.timeline.command import fetch_events
from rlslice.apps.timeline.trace_export import SWITCH_LANE, build_timeline, chrome_trace
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
    work = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield root, work
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


def _parts(discard_first: bool) -> tuple[StatePart, ...]:
    def move_class(i: int) -> MoveClass:
        return MoveClass.DISCARD if discard_first and i == 0 else MoveClass.OFFLOAD

    return tuple(
        StatePart(tag=f"p{i}", bytes=PART, move_class=move_class(i), need_order=i) for i in range(4)
    )


async def test_a_live_partial_switchs_timeline_names_the_outgoing_jobs_parts(
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
                await _two_switches(scheduler.address, agent, procs)
            finally:
                await channel.close(None)
                await stop_jobs(procs)
            events = await fetch_events(scheduler.address, "bench")
    finally:
        await scheduler.stop(0)

    timeline = build_timeline(events, "bench")
    first, *switches = [i for i in timeline.intervals if i.lane == SWITCH_LANE]
    assert first.name == "switch -> job-a"
    assert [s.name for s in switches] == [
        "switch job-a (discarded p0) -> job-b",
        "switch job-b (parked p3) -> job-a",
    ]
    assert switches[0].args["discarded_parts"] == "p0"
    assert "parked_parts" not in switches[0].args
    assert switches[1].args["parked_parts"] == "p3"
    assert "discarded_parts" not in switches[1].args
    snapshots = [i.name for i in timeline.intervals if i.category == "snapshot"]
    assert snapshots == ["snapshot job-a (discarded p0)", "snapshot job-b (parked p3)"]
    marks = [(i.lane, i.name) for i in timeline.instants if i.name.startswith(("parked", "disc"))]
    assert marks == [("job-a", "discarded p0"), ("job-b", "parked p3")]
    names = {e["name"] for e in chrome_trace(timeline)["traceEvents"]}
    assert "switch job-b (parked p3) -> job-a" in names


async def _two_switches(address: str, agent: Any, procs: list[Any]) -> None:
    def client(job: str) -> AsyncClient:
        return AsyncClient(job=job, group="bench", scheduler=address, device_bytes=SIZE)

    async with client("job-a") as a, client("job-b") as b:
        await a.acquire(timeout=60)
        procs.append(await _spawn(agent, "job-a", SIZE, 1))
        waiting = asyncio.ensure_future(b.acquire(timeout=60))
        await a.yield_()
        await waiting
        procs.append(await _spawn(agent, "job-b", SIZE, 2))
        waiting = asyncio.ensure_future(a.acquire(timeout=60))
        await b.yield_()
        await waiting
        await a.yield_()
