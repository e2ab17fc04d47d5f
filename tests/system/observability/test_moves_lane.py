"""The timeline's moves lane on a live scheduler: one event per node and move.

A real scheduler and a real `sim` agent on loopback, two real job processes registered with
the agent. a holds, b waits, a yields (a is snapshotted: b does not fit beside it), then a
acquires again (b is snapshotted, a restored).

Cases:
- the group's event ring holds a SNAPSHOT_DONE and a RESTORE_DONE event naming the job and,
  in `detail`, the node, with the epoch of the switch that made them;
- `build_timeline` puts them on the `[moves]` lanes as `snapshot a` and `restore a`;
- a switch whose incoming job never ran moves nothing of it: no restore event for b.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rlslice.apps.timeline.command import fetch_events
from rlslice.apps.timeline.trace_export import MOVES_LANE, build_timeline
from rlslice.client import AsyncClient
from rlslice.config import GroupSpec
from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.snapshot_agent import AgentSettings, SimSettings, start_agent
from rlslice.snapshot_agent.processes import identify


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rm-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def jobs() -> AsyncIterator[list[int]]:
    processes = [
        await asyncio.create_subprocess_exec("sleep", "120", stdin=asyncio.subprocess.DEVNULL)
        for _ in range(2)
    ]
    yield [p.pid for p in processes]
    for process in processes:
        process.kill()
        await process.wait()


async def _until(check: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_every_move_is_an_event_on_the_moves_lane(
    short_dir: Path, tmp_path: Path, jobs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RLSLICE_AGENT_SOCKET", "RLSLICE_TOKEN", "RLSLICE_JOB", "RLSLICE_GROUP"):
        monkeypatch.delenv(name, raising=False)
    scheduler = await start_scheduler(
        SchedulerSettings(
            address="127.0.0.1:0",
            # A headroom larger than the device: the two jobs never share it.
            groups=(GroupSpec(name="g", backend="sim", headroom_bytes=128 << 20),),
        )
    )
    agent = await start_agent(
        AgentSettings(
            node="n1",
            socket_path=short_dir / "agent.sock",
            state_dir=tmp_path / "state",
            host_reserve_bytes=0,
            sim=SimSettings(root=short_dir / "sim", capacity_bytes=64 << 20, rate_gbps=0.0),
            scheduler=scheduler.address,
        )
    )
    a, b = (AsyncClient(job=job, group="g", scheduler=scheduler.address) for job in "ab")
    try:
        await _until(lambda: "n1" in scheduler.coordinator.agents)
        for job, pid in zip("ab", jobs, strict=True):
            ref = identify(pid)
            assert ref is not None
            agent.engine.register(ref, job, "g")
        await a.acquire(phase="rollout")
        waiting = asyncio.ensure_future(b.acquire(phase="train"))
        await _until(lambda: [w.job for w in scheduler.engine.groups["g"].state.queue] == ["b"])
        await a.yield_()
        to_b = await waiting
        back = asyncio.ensure_future(a.acquire(phase="train"))
        await _until(lambda: [w.job for w in scheduler.engine.groups["g"].state.queue] == ["a"])
        await b.yield_()
        to_a = await back
        events = await fetch_events(scheduler.address, "g")
    finally:
        for client in (a, b):
            await client.close()
        await agent.stop(0)
        await scheduler.stop(0)

    moves = [(e.kind, e.job, e.detail, e.epoch) for e in events if e.kind.endswith("_DONE")]
    assert ("SNAPSHOT_DONE", "a", "n1", to_b.epoch) in moves
    assert ("SNAPSHOT_DONE", "b", "n1", to_a.epoch) in moves
    assert ("RESTORE_DONE", "a", "n1", to_a.epoch) in moves
    assert not any(kind == "RESTORE_DONE" and job == "b" for kind, job, _, _ in moves)
    # Overlapping moves (an overlapped switch) spill into `[moves] #2`, ...
    timeline = build_timeline(events, "g")
    lane = [i.name for i in timeline.intervals if i.lane.startswith(MOVES_LANE)]
    assert lane.count("snapshot a") == 1
    assert lane.count("restore a") == 1
