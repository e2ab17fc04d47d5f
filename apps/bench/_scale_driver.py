"""The driver of `rlslice bench scale`: registers the jobs, runs their random phases through
raw stubs on a few shared channels, and measures against a `SchedulerProcess`."""

from __future__ import annotations

import asyncio
import random
import time
from typing import cast

from rlslice.apps.bench._scale_figures import Result, Samples, plan, summarise, with_stalls
from rlslice.apps.bench._scale_server import SchedulerProcess, Stalls

LEASE_SECONDS = 3600.0  # no keep-alives during the run: leases outlast it
PROBE_RATE = 20.0
SETTLE_SECONDS = 1.0  # between creating the job tasks and opening the measured window


def ring_size() -> int:
    """Events each group's ring keeps (the scheduler's default setting)."""
    from rlslice.scheduler import SchedulerSettings

    return SchedulerSettings().event_ring_size


async def _drive(
    address: str,
    groups: int,
    jobs: int,
    seconds: float,
    rate: float,
    channels: int,
    seed: int,
    server: SchedulerProcess,
) -> Result:
    import gc

    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    opened = [open_channel(address) for _ in range(max(1, channels))]
    stubs = [
        cast("scheduler_pb2_grpc.SchedulerAsyncStub", scheduler_pb2_grpc.SchedulerStub(c))
        for c in opened
    ]
    rng = random.Random(seed)
    names = [(f"g{g:04d}", f"j{j}") for g in range(groups) for j in range(jobs)]
    leases: dict[tuple[str, str], tuple[str, str]] = {}
    gate = asyncio.Semaphore(256)

    async def register(index: int, group: str, job: str) -> None:
        async with gate:
            # Each (group, job) is its own actor: the job ids repeat across groups, and
            # without a session of its own each would count as one thread of control (and
            # be aborted as a deadlock by the cross-group check).
            request = pb.RegisterRequest(
                job=job, group=group, lease_seconds=LEASE_SECONDS, session=f"{job}-{group}"
            )
            answer = await stubs[index % len(stubs)].Register(request, timeout=60)
        leases[(group, job)] = (answer.lease_id, answer.secret)

    async def events_kept(index: int, group: str) -> int:
        async with gate:
            answer = await stubs[index % len(stubs)].GetEvents(
                pb.GetEventsRequest(group=group), timeout=60
            )
        return len(answer.events)

    async def count_events() -> int:
        groups_seen = sorted({g for g, _ in names})
        return sum(await asyncio.gather(*(events_kept(i, g) for i, g in enumerate(groups_seen))))

    began = time.perf_counter()
    await asyncio.gather(*(register(i, g, j) for i, (g, j) in enumerate(names)))
    register_seconds = time.perf_counter() - began
    rss_idle = server.rss()
    events_idle = await count_events()

    phases = plan(groups, jobs, rate)
    samples = Samples()
    # Every task exists and sleeps before the window opens: creating thousands of tasks
    # inside it would stall the driver's loop and be measured as acquire latency.
    start = time.perf_counter() + SETTLE_SECONDS
    deadline = start + seconds

    async def job_loop(index: int, group: str, job: str, local: random.Random) -> None:
        stub = stubs[index % len(stubs)]
        lease_id, secret = leases[(group, job)]
        await asyncio.sleep(start + local.uniform(0, phases.cycle) - time.perf_counter())
        while time.perf_counter() < deadline:
            phase = local.choice(("rollout", "train", "sync"))
            sent = time.perf_counter()
            try:
                grant = await stub.Acquire(
                    pb.AcquireRequest(
                        job=job, group=group, lease_id=lease_id, secret=secret, phase=phase
                    )
                )
            except Exception:  # counted: a bench reports failures, it does not stop on one
                samples.errors += 1
                return
            answered = time.perf_counter()
            if answered <= deadline:
                round_trip = answered - sent
                # waited_seconds runs from queueing to grant, a switch included (as the
                # scheduler measures it): what is left is transport and the scheduler's own work.
                samples.overhead.append(round_trip - grant.waited_seconds)
                samples.waited.append(grant.waited_seconds)
                if grant.waited_seconds == 0:
                    samples.immediate.append(round_trip)
            await asyncio.sleep(local.uniform(0.5, 1.5) * phases.hold)
            sent = time.perf_counter()
            try:
                await stub.Yield(
                    pb.YieldRequest(job=job, group=group, lease_id=lease_id, secret=secret)
                )
            except Exception:
                samples.errors += 1
                return
            if time.perf_counter() <= deadline:
                samples.yields.append(time.perf_counter() - sent)
            await asyncio.sleep(local.uniform(0.5, 1.5) * phases.cpu)

    async def probe() -> None:
        stub = stubs[0]
        await asyncio.sleep(start - time.perf_counter())
        while time.perf_counter() < deadline:
            group = f"g{rng.randrange(groups):04d}"
            sent = time.perf_counter()
            await stub.GetGroup(pb.GetGroupRequest(group=group))
            samples.probes.append(time.perf_counter() - sent)
            await asyncio.sleep(1 / PROBE_RATE)

    tasks = [
        asyncio.create_task(job_loop(i, g, j, random.Random(rng.random())))
        for i, (g, j) in enumerate(names)
    ]
    tasks.append(asyncio.create_task(probe()))
    # The driver is the measuring instrument: its own collector pauses (thousands of tasks
    # and calls) would show as scheduler latency. Freeze what exists, collect nothing during
    # the window, and report the driver's remaining loop lag beside the figures.
    gc.collect()
    gc.freeze()
    gc.disable()
    driver_stalls = Stalls()
    await asyncio.sleep(start - time.perf_counter())
    driver_watch = asyncio.create_task(driver_stalls.watch_loop())
    server.mark("start")
    cpu_before = server.cpu_seconds()
    await asyncio.sleep(deadline - time.perf_counter())
    cpu_seconds = server.cpu_seconds() - cpu_before
    server.mark("end")
    rss, peak = server.rss(), server.peak_rss()
    gc.enable()
    gc.unfreeze()
    driver_watch.cancel()
    driver_stalls.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    events_end = await count_events()
    for channel in opened:
        await channel.close(None)
    return summarise(
        groups,
        jobs,
        seconds,
        samples,
        register_seconds=register_seconds,
        cpu_seconds=cpu_seconds,
        rss_idle=rss_idle,
        rss=rss,
        peak_rss=peak,
        driver=driver_stalls.report(),
        events=(events_idle, events_end, groups * ring_size()),
    )


def measure(
    groups: int,
    jobs: int,
    seconds: float,
    rate: float,
    channels: int = 4,
    seed: int = 1,
    profile: str | None = None,
) -> Result:
    """One configuration against a fresh scheduler subprocess (cProfile stats to `profile`)."""
    server = SchedulerProcess(profile)
    try:
        result = asyncio.run(
            _drive(server.address, groups, jobs, seconds, rate, channels, seed, server)
        )
    finally:
        stalls = server.stop()
    return with_stalls(result, stalls)
