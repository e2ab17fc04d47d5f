"""`rlslice bench switch`, the `partial` section: need-based partial moves (issue 26).

Two sim jobs of equal size S take turns through a real scheduler and agent in this
process, on a node whose one device holds one job and three quarters of the other (and a
little more): only 25% of the outgoing job must leave for the incoming one to fit. Each
job's state is four tagged buffers of S/4 (`offload` parts, needed in order). The same
turns run twice, side by side: once with the jobs' parts declared in the group spec (the
switch moves one part out and the parked one back) and once without (every switch moves
both jobs whole). `moved_ratio` is the bytes the partial switches moved over the bytes the
whole ones moved (the scheduler's `switch_done` bytes). Target: <= 0.30. Every job's
bytes are checked (crc32) after each of its turns.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

PARTIAL_TARGET = 0.30
PARTS = 4
MiB = 1 << 20

_JOB = r"""
import sys, zlib
import numpy as np
from rlslice.client import sim
from rlslice.client._local import register_with_agent
socket_path, node_dir, job, size, seed, group, parts = sys.argv[1:8]
register_with_agent(socket_path, job, group)
device = sim.attach(job=job, node_dir=node_dir)
rng = np.random.default_rng(int(seed))
buffers = []
for i in range(int(parts)):
    buffer = device.alloc(int(size) // int(parts), tag=f"p{i}")
    np.frombuffer(buffer, dtype=np.uint8)[:] = rng.integers(0, 256, len(buffer), dtype=np.uint8)
    buffers.append(buffer)
def crc():
    value = 0
    for buffer in buffers:
        value = zlib.crc32(buffer, value)
    return value
print(crc(), flush=True)
for line in sys.stdin:
    print(crc(), flush=True)
"""


async def partial_vs_whole(
    size: int, scale: float, link_gbps: float, rounds: int, root: Path, work: Path
) -> dict[str, Any]:
    """Bytes moved by switches of two jobs that declared parts vs two that did not."""
    real = max(PARTS * MiB, int(size / scale)) // PARTS * PARTS
    partial, identical_p = await _turns(True, real, scale, link_gbps, rounds, root, work)
    whole, identical_w = await _turns(False, real, scale, link_gbps, rounds, root, work)
    ratio = partial / whole if whole else 1.0
    return {
        "equivalent_bytes": size,
        "real_bytes": real,
        "rounds": rounds,
        "partial_moved_bytes": partial,
        "whole_moved_bytes": whole,
        "moved_ratio": ratio,
        "target": PARTIAL_TARGET,
        "meets_target": ratio <= PARTIAL_TARGET,
        "identical": identical_p and identical_w,
    }


async def _turns(
    declared: bool, real: int, scale: float, link_gbps: float, rounds: int, root: Path, work: Path
) -> tuple[int, bool]:
    """(bytes the measured switches moved, every job's bytes intact) over `rounds` turns."""
    from rlslice.adapters.channel import open_channel
    from rlslice.apps.bench._switch_duplex import _agent, _options, stop_jobs
    from rlslice.config import GroupSpec, JobSpec, StatePart
    from rlslice.scheduler import SchedulerSettings, start_scheduler
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    quarter = real // PARTS
    parts = tuple(StatePart(tag=f"p{i}", bytes=quarter, need_order=i) for i in range(PARTS))
    jobs = ("job-a", "job-b")
    spec = GroupSpec(
        name="bench", jobs=tuple(JobSpec(name=j, parts=parts if declared else ()) for j in jobs)
    )
    capacity = real + (PARTS - 1) * quarter + quarter // 4
    node = "partial" if declared else "whole"
    scheduler = await start_scheduler(SchedulerSettings(address="127.0.0.1:0"))
    procs: dict[str, Any] = {}
    try:
        scheduler.engine.put_group(spec)
        async with _agent(node, capacity, _options(real, scale, link_gbps), root, work) as agent:
            channel = open_channel(scheduler.address)
            stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
            try:
                await stub.RegisterAgent(
                    pb.RegisterAgentRequest(
                        node=agent.node, address=agent.address, backends=["sim"]
                    )
                )
                leases = {
                    j: await stub.Register(
                        pb.RegisterRequest(job=j, group="bench", device_bytes=real)
                    )
                    for j in jobs
                }
                return await _run(stub, scheduler.engine, agent, leases, jobs, rounds, procs, real)
            finally:
                await channel.close(None)
                await stop_jobs(list(procs.values()))
    finally:
        await scheduler.stop(0)


async def _run(
    stub: Any,
    engine: Any,
    agent: Any,
    leases: dict[str, Any],
    jobs: tuple[str, ...],
    rounds: int,
    procs: dict[str, Any],
    real: int,
) -> tuple[int, bool]:
    """a holds first and allocates; b takes a turn and allocates (the warm-up switch);
    then `rounds` measured turns, each job's bytes checked as it runs again."""
    from rlslice.apps.bench._switch_duplex import _call

    await _call(stub, "Acquire", jobs[0], "bench", leases)
    procs[jobs[0]] = await _spawn(agent, jobs[0], real, 1)
    moved = 0
    identical = True
    for turn in range(rounds + 1):
        holder, waiter = jobs[turn % 2], jobs[(turn + 1) % 2]
        events = engine.watch("bench")
        try:
            call = asyncio.ensure_future(_call(stub, "Acquire", waiter, "bench", leases))
            await _call(stub, "Yield", holder, "bench", leases)
            await call
            done = await _switch_done(events, waiter)
        finally:
            engine.unwatch("bench", events)
        if waiter not in procs:
            procs[waiter] = await _spawn(agent, waiter, real, 2)
            continue  # the warm-up: the waiter had nothing to restore
        moved += done
        identical &= await procs[waiter].crc_now() == procs[waiter].crc
    return moved, identical


async def _switch_done(events: asyncio.Queue[Any], job: str) -> int:
    """The bytes of the switch to `job`, once it is done."""
    while True:
        entry = await asyncio.wait_for(events.get(), 120)
        if entry is None:
            raise RuntimeError("the scheduler stopped")
        if entry.kind == "switch_done" and entry.job == job:
            return int(entry.bytes)


async def _spawn(agent: Any, job: str, size: int, seed: int) -> Any:
    """A real job of `size` bytes in `PARTS` tagged buffers, once it has filled them."""
    from rlslice.apps.bench._switch_duplex import JobProcess

    node_dir = agent.settings.sim.root / agent.node
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _JOB, str(agent.socket_path), str(node_dir), job, str(size),
        str(seed), "bench", str(PARTS), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    return JobProcess(process, int(await asyncio.wait_for(process.stdout.readline(), 300)))
