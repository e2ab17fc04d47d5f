"""The sections of `rlslice bench switch` on a duplex link: overlapped vs serial switches at
one agent, and prefetched grants through a scheduler vs a 0-byte handoff (see switch.py)."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlslice.apps.bench.switch import _JOB, OVERLAP_TARGET, PREFETCH_MARGIN_S

MiB = 1 << 20
#: Room on the device beyond one job in the overlap section (both never fit together).
SLACK = 1 * MiB


@dataclass
class JobProcess:
    """A bench job: its process and the CRC of its bytes when it started."""

    process: asyncio.subprocess.Process
    crc: int

    async def crc_now(self) -> int:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(b"crc\n")
        await self.process.stdin.drain()
        return int(await asyncio.wait_for(self.process.stdout.readline(), 300))


async def spawn_job(agent: Any, job: str, size: int, seed: int, group: str) -> JobProcess:
    """A real job of `size` emulated bytes, registered with `agent`, once it has filled them."""
    node_dir = agent.settings.sim.root / agent.node
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _JOB, str(agent.socket_path), str(node_dir), job, str(size),
        str(seed), group, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    return JobProcess(process, int(await asyncio.wait_for(process.stdout.readline(), 300)))


def _options(real_bytes: int, scale: float, link_gbps: float) -> dict[str, str]:
    """The agent's sim options: the link scaled down, and chunks of 64 MiB-equivalent."""
    del real_bytes
    chunk = max(64 * 1024, int((64 * MiB) / scale))
    rate = repr(link_gbps / scale)
    return {"out_gbps": rate, "in_gbps": rate, "chunk_bytes": str(chunk)}


@contextlib.asynccontextmanager
async def _agent(
    node: str, capacity: int, options: dict[str, str], root: Path, work: Path
) -> AsyncIterator[Any]:
    from rlslice.snapshot_agent import AgentSettings, SimSettings, start_agent

    settings = AgentSettings(
        node=node,
        state_dir=work / f"state-{node}",
        socket_path=work / f"{node}.sock",
        host_reserve_bytes=0,
        sim=SimSettings(root=root, capacity_bytes=capacity, rate_gbps=0.0),
        backend_options={"sim": options},
    )
    agent = await start_agent(settings)
    try:
        yield agent
    finally:
        await agent.stop(0)


async def stop_jobs(procs: list[JobProcess]) -> None:
    """Kill the jobs (one may have exited already) and reap them."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.process.kill()
        await proc.process.wait()


async def overlap_one(
    size: int, scale: float, link_gbps: float, repeats: int, root: Path, work: Path
) -> dict[str, Any]:
    """Serial vs overlapped switches of two equal jobs of `size` (GiB-equivalent) bytes."""
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import agent_pb2 as apb
    from rlslice.v1alpha1 import agent_pb2_grpc

    real = max(MiB, int(size / scale))
    node = f"duplex-{size >> 20}"
    async with _agent(node, real + SLACK, _options(real, scale, link_gbps), root, work) as agent:
        b = await spawn_job(agent, "job-b", real, 2, "bench")
        channel = open_channel(agent.address, token=agent.token)
        stub: Any = agent_pb2_grpc.AgentStub(channel)
        procs = [b]
        try:
            epoch = 1
            await stub.Snapshot(apb.SnapshotRequest(job="job-b", group="bench", epoch=epoch))
            a = await spawn_job(agent, "job-a", real, 1, "bench")
            procs.append(a)
            seconds: dict[str, list[float]] = {"serial": [], "overlapped": []}
            overlapped_flags: list[bool] = []
            outgoing, incoming = "job-a", "job-b"
            for _ in range(repeats):
                for mode in ("serial", "overlapped"):
                    epoch += 1
                    took, overlapped = await _timed_switch(stub, mode, outgoing, incoming, epoch)
                    seconds[mode].append(took)
                    if mode == "overlapped":
                        overlapped_flags.append(overlapped)
                    outgoing, incoming = incoming, outgoing
            # `outgoing` runs now, `incoming` is parked: check one, switch, check the other.
            by_name = {"job-a": a, "job-b": b}
            identical = await by_name[outgoing].crc_now() == by_name[outgoing].crc
            await stub.Switch(_switch_request(outgoing, incoming, epoch + 1))
            identical &= await by_name[incoming].crc_now() == by_name[incoming].crc
        finally:
            await channel.close(None)
            await stop_jobs(procs)
    serial_s = statistics.median(seconds["serial"])
    overlapped_s = statistics.median(seconds["overlapped"])
    ratio = overlapped_s / serial_s
    return {
        "equivalent_bytes": size,
        "real_bytes": real,
        "one_way_seconds": size / (link_gbps * 1e9),
        "serial_seconds": serial_s,
        "overlapped_seconds": overlapped_s,
        "ratio": ratio,
        "target_ratio": OVERLAP_TARGET,
        "meets_target": ratio <= OVERLAP_TARGET,
        "overlapped": all(overlapped_flags),
        "identical": identical,
    }


def _switch_request(outgoing: str, incoming: str, epoch: int) -> Any:
    from rlslice.v1alpha1 import agent_pb2 as apb

    return apb.SwitchRequest(
        group="bench",
        epoch=epoch,
        outgoing=[apb.SwitchMove(job=outgoing)],
        incoming=apb.SwitchMove(job=incoming),
    )


async def _timed_switch(
    stub: Any, mode: str, outgoing: str, incoming: str, epoch: int
) -> tuple[float, bool]:
    """Seconds of one switch, `serial` (Snapshot, then Restore) or `overlapped` (one Switch),
    and whether the agent overlapped it."""
    from rlslice.v1alpha1 import agent_pb2 as apb

    started = time.perf_counter()
    if mode == "serial":
        await stub.Snapshot(apb.SnapshotRequest(job=outgoing, group="bench", epoch=epoch))
        await stub.Restore(apb.RestoreRequest(job=incoming, group="bench", epoch=epoch))
        return time.perf_counter() - started, False
    result = await stub.Switch(_switch_request(outgoing, incoming, epoch))
    took = time.perf_counter() - started
    if result.HasField("failure"):
        raise RuntimeError(f"switch failed: {result.failure.reason}")
    return took, result.overlapped


async def prefetch_vs_handoff(
    size: int, scale: float, link_gbps: float, rounds: int, root: Path, work: Path
) -> dict[str, Any]:
    """Yield-to-grant time of prefetched waiters vs a handoff with nothing to move."""
    from rlslice.adapters.channel import open_channel
    from rlslice.config import GroupSpec
    from rlslice.scheduler import SchedulerSettings, start_scheduler
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    real = max(MiB, int(size / scale))
    handoff = await _handoff(rounds)
    scheduler = await start_scheduler(SchedulerSettings(address="127.0.0.1:0"))
    try:
        scheduler.engine.put_group(GroupSpec(name="bench"))
        options = _options(real, scale, link_gbps)
        async with _agent("prefetch", 2 * real + SLACK, options, root, work) as agent:
            channel = open_channel(scheduler.address)
            stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
            await stub.RegisterAgent(
                pb.RegisterAgentRequest(node=agent.node, address=agent.address, backends=["sim"])
            )
            procs: list[JobProcess] = []
            try:
                jobs = ("job-a", "job-b", "job-c")
                leases = {}
                for i, job in enumerate(jobs):
                    if i < 2:  # job-c's memory comes later: the device holds two
                        procs.append(await spawn_job(agent, job, real, i + 1, "bench"))
                    leases[job] = await stub.Register(
                        pb.RegisterRequest(job=job, group="bench", device_bytes=real)
                    )
                times, prefetched, identical = await _rounds(
                    stub, scheduler.engine, agent, leases, jobs, rounds, procs, real
                )
            finally:
                await channel.close(None)
                await stop_jobs(procs)
    finally:
        await scheduler.stop(0)
    median = statistics.median(times)
    return {
        "equivalent_bytes": size,
        "real_bytes": real,
        "rounds": len(times),
        "prefetched_ms": median * 1e3,
        "all_prefetched": prefetched,
        "handoff_ms": handoff * 1e3,
        "target_ms": (handoff + PREFETCH_MARGIN_S) * 1e3,
        "meets_target": prefetched and median <= handoff + PREFETCH_MARGIN_S,
        "identical": identical,
    }


async def _rounds(
    stub: Any,
    engine: Any,
    agent: Any,
    leases: dict[str, Any],
    jobs: tuple[str, ...],
    rounds: int,
    procs: list[JobProcess],
    real: int,
) -> tuple[list[float], bool, bool]:
    """Jobs take turns a, b, c, a, ...; (yield-to-grant seconds, all prefetched, bytes
    identical). The first two turns warm up: the waiters are new to the scheduler, so
    nothing is parked to prefetch; c's turn parks a (the device holds two), and c's process
    allocates only then. From the third turn every waiter is parked, and prefetched beside
    the holder by evicting the idle third job."""
    by_job = dict(zip(jobs, procs, strict=False))
    await _call(stub, "Acquire", jobs[0], "bench", leases)
    times: list[float] = []
    all_prefetched = identical = True
    turn = 0
    while len(times) < rounds:
        holder, waiter = jobs[turn % 3], jobs[(turn + 1) % 3]
        measured = turn >= 2
        events = engine.watch("bench")
        try:
            call = asyncio.ensure_future(_call(stub, "Acquire", waiter, "bench", leases))
            if measured:
                all_prefetched &= await _prefetched(events, waiter)
            else:
                await _queued(engine, "bench", waiter)
            started = time.perf_counter()
            await _call(stub, "Yield", holder, "bench", leases)
            await call
            if measured:
                times.append(time.perf_counter() - started)
        finally:
            engine.unwatch("bench", events)
        if waiter not in by_job:  # c: its memory fits now that a is parked
            by_job[waiter] = await spawn_job(agent, waiter, real, 3, "bench")
            procs.append(by_job[waiter])
        elif measured:  # the new holder runs: its bytes are as it left them
            proc = by_job[waiter]
            identical &= await proc.crc_now() == proc.crc
        turn += 1
    return times, all_prefetched, identical


def _call(stub: Any, method: str, job: str, group: str, leases: dict[str, Any]) -> Any:
    from rlslice.v1alpha1 import scheduler_pb2 as pb

    lease = leases[job]
    kind = pb.AcquireRequest if method == "Acquire" else pb.YieldRequest
    request = kind(job=job, group=group, lease_id=lease.lease_id, secret=lease.secret)
    return getattr(stub, method)(request)


async def _prefetched(events: asyncio.Queue[Any], job: str) -> bool:
    """Wait for `job`'s prefetch to end; True when it was done (moved beside the holder)."""
    while True:
        entry = await asyncio.wait_for(events.get(), 120)
        if entry is None:
            return False
        if entry.kind == "prefetch" and entry.job == job and entry.detail != "started":
            return bool(entry.detail == "done")


async def _queued(engine: Any, group: str, job: str) -> None:
    """Until `job` waits in `group`'s queue (woken by the group's events)."""
    events = engine.watch(group)
    try:
        while not any(w.job == job for w in engine.groups[group].state.queue):
            await asyncio.wait_for(events.get(), 60)
    finally:
        engine.unwatch(group, events)


async def _handoff(rounds: int) -> float:
    """Median yield-to-grant time on a scheduler without agents (nothing can move)."""
    from rlslice.adapters.channel import open_channel
    from rlslice.scheduler import SchedulerSettings, start_scheduler
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    running = await start_scheduler(
        SchedulerSettings(address="127.0.0.1:0", auto_create_groups=True)
    )
    channel = open_channel(running.address)
    stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
    try:
        leases = {}
        for job in ("job-a", "job-b"):
            leases[job] = await stub.Register(pb.RegisterRequest(job=job, group="handoff"))

        await _call(stub, "Acquire", "job-a", "handoff", leases)
        holder, waiter = "job-a", "job-b"
        times = []
        for turn in range(rounds + 2):
            pending = asyncio.ensure_future(_call(stub, "Acquire", waiter, "handoff", leases))
            await _queued(running.engine, "handoff", waiter)
            started = time.perf_counter()
            await _call(stub, "Yield", holder, "handoff", leases)
            await pending
            if turn >= 2:
                times.append(time.perf_counter() - started)
            holder, waiter = waiter, holder
        return statistics.median(times)
    finally:
        await channel.close(None)
        await running.stop(0)
