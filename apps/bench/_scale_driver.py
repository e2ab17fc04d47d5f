"""The driver of `rlslice bench scale`: registers the jobs, runs their random phases through
raw stubs on a few shared channels, and measures against a `SchedulerProcess`."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any, cast

from rlslice.apps.bench._scale_figures import (
    PhasePlan,
    Result,
    Samples,
    plan,
    summarise,
    with_stalls,
)
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
    from rlslice.adapters.channel import open_channel

    opened = [open_channel(address) for _ in range(max(1, channels))]
    driver = _Driver(opened, groups, jobs, random.Random(seed))
    began = time.perf_counter()
    await driver.register_all()
    register_seconds = time.perf_counter() - began
    rss_idle = server.rss()
    events_idle = await driver.count_events()
    window = await driver.run_window(plan(groups, jobs, rate), seconds, server)
    events_end = await driver.count_events()
    for channel in opened:
        await channel.close(None)
    return summarise(
        groups,
        jobs,
        seconds,
        driver.samples,
        register_seconds=register_seconds,
        cpu_seconds=window.cpu_seconds,
        rss_idle=rss_idle,
        rss=window.rss,
        peak_rss=window.peak_rss,
        driver=window.driver_stalls,
        events=(events_idle, events_end, groups * ring_size()),
    )


@dataclass(frozen=True)
class _Window:
    """What the server used during the measured window."""

    cpu_seconds: float
    rss: int
    peak_rss: int
    driver_stalls: dict[str, float]


class _Driver:
    """The bench's jobs: (group, job) actors on raw stubs over a few shared channels."""

    def __init__(self, channels: list[Any], groups: int, jobs: int, rng: random.Random) -> None:
        from rlslice.v1alpha1 import scheduler_pb2_grpc

        self.stubs = [
            cast("scheduler_pb2_grpc.SchedulerAsyncStub", scheduler_pb2_grpc.SchedulerStub(c))
            for c in channels
        ]
        self.groups = groups
        self.rng = rng
        self.names = [(f"g{g:04d}", f"j{j}") for g in range(groups) for j in range(jobs)]
        self.leases: dict[tuple[str, str], tuple[str, str]] = {}
        self.gate = asyncio.Semaphore(256)
        self.samples = Samples()
        self.start = self.deadline = 0.0

    async def register_all(self) -> None:
        await asyncio.gather(*(self._register(i, g, j) for i, (g, j) in enumerate(self.names)))

    async def _register(self, index: int, group: str, job: str) -> None:
        from rlslice.v1alpha1 import scheduler_pb2 as pb

        async with self.gate:
            # Each (group, job) is its own actor: the job ids repeat across groups, and
            # without a session of its own each would count as one thread of control (and
            # be aborted as a deadlock by the cross-group check).
            request = pb.RegisterRequest(
                job=job, group=group, lease_seconds=LEASE_SECONDS, session=f"{job}-{group}"
            )
            answer = await self.stubs[index % len(self.stubs)].Register(request, timeout=60)
        self.leases[(group, job)] = (answer.lease_id, answer.secret)

    async def count_events(self) -> int:
        """Events kept in every group's ring."""
        groups_seen = sorted({g for g, _ in self.names})
        counts = await asyncio.gather(*(self._events_kept(i, g) for i, g in enumerate(groups_seen)))
        return sum(counts)

    async def _events_kept(self, index: int, group: str) -> int:
        from rlslice.v1alpha1 import scheduler_pb2 as pb

        async with self.gate:
            answer = await self.stubs[index % len(self.stubs)].GetEvents(
                pb.GetEventsRequest(group=group), timeout=60
            )
        return len(answer.events)

    async def run_window(
        self, phases: PhasePlan, seconds: float, server: SchedulerProcess
    ) -> _Window:
        """Every job loops through its phases for `seconds`, measured."""
        import gc

        # Every task exists and sleeps before the window opens: creating thousands of tasks
        # inside it would stall the driver's loop and be measured as acquire latency.
        self.start = time.perf_counter() + SETTLE_SECONDS
        self.deadline = self.start + seconds
        tasks = [
            asyncio.create_task(self._job_loop(i, g, j, phases, random.Random(self.rng.random())))
            for i, (g, j) in enumerate(self.names)
        ]
        tasks.append(asyncio.create_task(self._probe()))
        # The driver is the measuring instrument: its own collector pauses (thousands of
        # tasks and calls) would show as scheduler latency. Freeze what exists, collect
        # nothing during the window, and report the driver's remaining loop lag beside it.
        gc.collect()
        gc.freeze()
        gc.disable()
        driver_stalls = Stalls()
        await asyncio.sleep(self.start - time.perf_counter())
        driver_watch = asyncio.create_task(driver_stalls.watch_loop())
        server.mark("start")
        cpu_before = server.cpu_seconds()
        await asyncio.sleep(self.deadline - time.perf_counter())
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
        return _Window(cpu_seconds, rss, peak, driver_stalls.report())

    async def _job_loop(
        self, index: int, group: str, job: str, phases: PhasePlan, local: random.Random
    ) -> None:
        from rlslice.v1alpha1 import scheduler_pb2 as pb

        stub, samples = self.stubs[index % len(self.stubs)], self.samples
        lease_id, secret = self.leases[(group, job)]
        await asyncio.sleep(self.start + local.uniform(0, phases.cycle) - time.perf_counter())
        while time.perf_counter() < self.deadline:
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
            if answered <= self.deadline:
                round_trip = answered - sent
                # waited_seconds runs from queueing to grant, a switch included (as the
                # scheduler measures it): what is left is transport and the scheduler's work.
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
            if time.perf_counter() <= self.deadline:
                samples.yields.append(time.perf_counter() - sent)
            await asyncio.sleep(local.uniform(0.5, 1.5) * phases.cpu)

    async def _probe(self) -> None:
        from rlslice.v1alpha1 import scheduler_pb2 as pb

        stub = self.stubs[0]
        await asyncio.sleep(self.start - time.perf_counter())
        while time.perf_counter() < self.deadline:
            group = f"g{self.rng.randrange(self.groups):04d}"
            sent = time.perf_counter()
            await stub.GetGroup(pb.GetGroupRequest(group=group))
            self.samples.probes.append(time.perf_counter() - sent)
            await asyncio.sleep(1 / PROBE_RATE)


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
