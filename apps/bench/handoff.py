"""`rlslice bench handoff`: what a lock costs, next to a bare gRPC round trip, in one run.

The scheduler runs in a subprocess (`rlslice scheduler` on 127.0.0.1, memory store, no
agents) so it has its own interpreter, as in production; `--in-process` runs it on the
bench's own event loop instead. The bench then measures, over raw stubs on one channel:

- bare: a health Check round trip;
- acquire: an uncontended Acquire of a resident job (and Acquire+Yield);
- handoff: job A yields while job B's Acquire is blocked; the time from sending A's Yield
  to B's Acquire returning.

Targets (2-core machine): acquire p99 <= 2x bare p99; handoff p99 <= 5x bare p99.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from rlslice.planner.stats import percentile
from rlslice.testing import child_env, rlslice_argv

ACQUIRE_TARGET = 2.0
HANDOFF_TARGET = 5.0


def configure(parser: argparse.ArgumentParser) -> None:
    _add_agents_flag(parser)
    parser.add_argument("--iterations", type=int, default=2000, help="samples per measurement")
    parser.add_argument("--handoffs", type=int, default=1000, help="handoff samples")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured calls first")
    parser.add_argument(
        "--in-process", action="store_true", help="run the scheduler on the bench's own loop"
    )


def _add_agents_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agents",
        type=int,
        default=3,
        help="also time handoffs through this many sim agents at zero bytes (0: skip)",
    )


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(measure(args))
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 0


def _percentiles(samples: list[float]) -> dict[str, float]:
    # Linear interpolation: p50 is the median, as statistics.median gave before.
    return {
        "p50_ms": percentile(samples, 50) * 1e3,
        "p99_ms": percentile(samples, 99) * 1e3,
        "n": len(samples),
    }


@asynccontextmanager
async def _scheduler(in_process: bool) -> AsyncIterator[str]:
    if in_process:
        from rlslice.scheduler import SchedulerSettings, start_scheduler

        running = await start_scheduler(
            SchedulerSettings(address="127.0.0.1:0", auto_create_groups=True)
        )
        try:
            yield running.address
        finally:
            await running.stop(0)
        return
    command = rlslice_argv("scheduler", "--address", "127.0.0.1:0", "--auto-create-groups")
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, env=child_env()
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        found = re.search(r"listening on (\S+)", line)
        if not found:
            raise RuntimeError(f"scheduler did not start: {line!r}")
        yield found.group(1)
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 10)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    async with _scheduler(args.in_process) as address, open_channel(address) as channel:
        stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
        jobs = await _two_resident_jobs(stub)
        bare, acquire, cycle = await _uncontended(channel, stub, jobs[0], args)
        handoff = await _handoffs(stub, jobs, args.warmup // 4, args.handoffs)
        through_agents: list[float] = []
        if args.agents > 0:
            through_agents = await _handoffs_through_agents(
                stub, address, args.agents, args.handoffs // 4, args.warmup // 8
            )
    result: dict[str, Any] = {
        "scheduler": "in-process" if args.in_process else "subprocess",
        "bare_roundtrip": _percentiles(bare),
        "uncontended_acquire": _percentiles(acquire),
        "uncontended_acquire_yield": _percentiles(cycle),
        "handoff": _percentiles(handoff),
    }
    if through_agents:
        result["handoff_through_agents"] = {
            **_percentiles(through_agents),
            "agents": args.agents,
            "bytes": 0,
        }
    return _with_ratios(result)


#: (Acquire request, Yield request) of one job.
_Calls = tuple[Any, Any]


async def _two_resident_jobs(stub: Any) -> tuple[_Calls, _Calls]:
    """Jobs a and b registered in group `bench`, each run once so both are resident: later
    grants need no switch."""
    from rlslice.v1alpha1 import scheduler_pb2 as pb

    calls = []
    for job in ("a", "b"):
        lease = await stub.Register(pb.RegisterRequest(job=job, group="bench", lease_seconds=600))
        ids = {"job": job, "group": "bench", "lease_id": lease.lease_id, "secret": lease.secret}
        acquire, yield_ = pb.AcquireRequest(**ids), pb.YieldRequest(**ids)
        await stub.Acquire(acquire)
        await stub.Yield(yield_)
        calls.append((acquire, yield_))
    return calls[0], calls[1]


async def _uncontended(
    channel: Any, stub: Any, job: _Calls, args: argparse.Namespace
) -> tuple[list[float], list[float], list[float]]:
    """Bare round trips (health Check), uncontended Acquires and Acquire+Yield cycles."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    clock = time.perf_counter
    health = health_pb2_grpc.HealthStub(channel)
    check = health_pb2.HealthCheckRequest()
    bare: list[float] = []
    acquire: list[float] = []
    cycle: list[float] = []
    # Interleave the measurements so drift (CPU frequency, noise) hits all alike.
    for i in range(args.warmup + args.iterations):
        t0 = clock()
        await health.Check(check)
        t1 = clock()
        await stub.Acquire(job[0])
        t2 = clock()
        await stub.Yield(job[1])
        t3 = clock()
        if i >= args.warmup:
            bare.append(t1 - t0)
            acquire.append(t2 - t1)
            cycle.append(t3 - t1)
    return bare, acquire, cycle


async def _handoffs(
    stub: Any,
    jobs: tuple[_Calls, _Calls],
    warmup: int,
    samples: int,
    group: str = "bench",
    prefetches: bool = False,
) -> list[float]:
    """Yield of the holder to the grant of the queued job, alternating the two jobs.

    `prefetches` (for a group with agents): a parked waiter that queues makes the scheduler
    try to restore it beside the holder (a prefetch), which holds the group's switch slot
    for a Status round. A holder yields seconds later in a real job; here it would yield
    at once and time that attempt too, so each round first waits for the attempt's end in
    the group's event ring (only a parked waiter gets one). The ring is read with
    GetEvents between rounds, not through a Watch stream: a stream would wake the bench
    with every event of the switch it times, on the same cores."""
    from rlslice.v1alpha1 import scheduler_pb2 as pb

    clock = time.perf_counter
    handoff: list[float] = []
    group_request = pb.GetGroupRequest(group=group)
    holder, waiter = jobs
    await stub.Acquire(holder[0])
    for i in range(warmup + samples):
        blocked = asyncio.ensure_future(stub.Acquire(waiter[0]))
        # Setup, outside the measured window: wait until the waiter is queued.
        while not (status := await stub.GetGroup(group_request)).queue:  # noqa: ASYNC110
            await asyncio.sleep(0)
        if prefetches and waiter[0].job in status.parked:
            await _prefetch_tried(stub, group, waiter[0].job, status.epoch)
        t0 = clock()
        await stub.Yield(holder[1])
        await blocked
        t1 = clock()
        if i >= warmup:
            handoff.append(t1 - t0)
        holder, waiter = waiter, holder
    await stub.Yield(holder[1])
    return handoff


async def _prefetch_tried(stub: Any, group: str, job: str, epoch: int) -> None:
    """Poll the group's event ring until `job`'s prefetch attempt at `epoch` has ended (its
    PREFETCH event after "started": "done", "skipped: ..." or "failed: ...")."""
    from rlslice.v1alpha1 import scheduler_pb2 as pb

    request = pb.GetEventsRequest(group=group, limit=16)
    deadline = time.monotonic() + PREFETCH_WAIT_SECONDS
    while time.monotonic() < deadline:
        for event in (await stub.GetEvents(request)).events:
            ending = event.kind == pb.EVENT_KIND_PREFETCH and event.detail != "started"
            if ending and event.job == job and event.epoch == epoch:
                return
        await asyncio.sleep(0.001)
    raise RuntimeError(
        f"no prefetch attempt for job {job} within {PREFETCH_WAIT_SECONDS:g} s: the "
        "bench expects the scheduler to try (and skip) one for each parked waiter"
    )


PREFETCH_WAIT_SECONDS = 10.0


def _with_ratios(result: dict[str, Any]) -> dict[str, Any]:
    bare_p99 = result["bare_roundtrip"]["p99_ms"]
    result["acquire_p99_ratio"] = result["uncontended_acquire"]["p99_ms"] / bare_p99
    result["acquire_yield_p99_ratio"] = result["uncontended_acquire_yield"]["p99_ms"] / bare_p99
    result["handoff_p99_ratio"] = result["handoff"]["p99_ms"] / bare_p99
    result["acquire_target"] = ACQUIRE_TARGET
    result["handoff_target"] = HANDOFF_TARGET
    result["acquire_ok"] = result["acquire_p99_ratio"] <= ACQUIRE_TARGET
    result["handoff_ok"] = result["handoff_p99_ratio"] <= HANDOFF_TARGET
    return result


def _print(result: dict[str, Any]) -> None:
    print(f"scheduler: {result['scheduler']}, loopback, no agents")
    print(f"{'measurement':28} {'p50 ms':>9} {'p99 ms':>9} {'n':>6}")
    for key in ("bare_roundtrip", "uncontended_acquire", "uncontended_acquire_yield", "handoff"):
        row = result[key]
        print(f"{key:28} {row['p50_ms']:9.3f} {row['p99_ms']:9.3f} {row['n']:6d}")
    if "handoff_through_agents" in result:
        row = result["handoff_through_agents"]
        label = f"handoff, {row['agents']} sim agents"
        print(f"{label:28} {row['p50_ms']:9.3f} {row['p99_ms']:9.3f} {row['n']:6d}")
    print(
        f"acquire p99 / bare p99 = {result['acquire_p99_ratio']:.2f} "
        f"(target <= {ACQUIRE_TARGET:g}: {'ok' if result['acquire_ok'] else 'MISSED'})"
    )
    print(f"acquire+yield p99 / bare p99 = {result['acquire_yield_p99_ratio']:.2f}")
    print(
        f"handoff p99 / bare p99 = {result['handoff_p99_ratio']:.2f} "
        f"(target <= {HANDOFF_TARGET:g}: {'ok' if result['handoff_ok'] else 'MISSED'})"
    )


async def _handoffs_through_agents(
    stub: Any, address: str, agents: int, samples: int, warmup: int
) -> list[float]:
    """Handoffs in a group of `agents` sim agents whose jobs hold zero bytes.

    Each job has a real (sleeping) process on every node, registered through `rlslice run`;
    the group's headroom keeps two jobs from sharing a device, so every handoff is a full
    switch: Status on every node, Snapshot of the outgoing job on every node in parallel
    (its processes really stopped), Restore of the incoming one, grant. With nothing to
    copy, what is timed is the coordinator's own overhead.
    """
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="rlslice-bench-"))
    sim_root = Path(tempfile.mkdtemp(prefix="rlslice-bench-sim-", dir=_shared_memory()))
    processes: list[asyncio.subprocess.Process] = []
    try:
        jobs = await _agents_and_jobs(stub, address, agents, work, sim_root, processes)
        return await _handoffs(stub, jobs, warmup, samples, group="bench-agents", prefetches=True)
    finally:
        # The jobs' own processes first, by SIGKILL: the job parked last is stopped, and a
        # stopped process would keep the SIGTERM its wrapper forwards pending for ever.
        _kill_descendants([p.pid for p in processes if p.returncode is None])
        for process in reversed(processes):
            if process.returncode is None:
                process.terminate()
        for process in processes:
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sim_root, ignore_errors=True)


def _kill_descendants(pids: list[int]) -> None:
    """SIGKILL every descendant of `pids` (stopped ones included)."""
    import psutil

    for pid in pids:
        try:
            descendants = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue
        for process in descendants:
            with contextlib.suppress(psutil.Error):
                process.kill()


def _shared_memory() -> str | None:
    """Where the `sim` backend keeps its emulated device memory by default (the parent of
    `DEFAULT_SIM_ROOT`, a tmpfs), when this machine has it; else the temp folder."""
    from rlslice.env import DEFAULT_SIM_ROOT

    parent = Path(DEFAULT_SIM_ROOT).parent
    return str(parent) if parent.is_dir() else None


async def _agents_and_jobs(
    stub: Any,
    address: str,
    agents: int,
    work: Path,
    sim_root: Path,
    processes: list[asyncio.subprocess.Process],
) -> tuple[_Calls, _Calls]:
    """`agents` sim agents registered with the scheduler, group `bench-agents` over them,
    and jobs ga and gb with a sleeping process on every node; started processes go into
    `processes` (the caller stops them). The emulated device memory lives in `sim_root`,
    on shared memory as the backend's default does; each agent's job table in `work`."""
    from rlslice.adapters.wire import group_spec_to_proto
    from rlslice.config import GroupSpec
    from rlslice.v1alpha1 import scheduler_pb2 as pb

    env = child_env()
    for i in range(agents):
        node = f"bench-{i}"
        await _spawn(
            processes, env, "agent", "--node", node, "--address", "127.0.0.1:0",
            "--socket", str(work / f"{node}.sock"), "--sim-root", str(sim_root),
            "--state-dir", str(work / node), "--scheduler", address,
        )  # fmt: skip
    # Agent registration required: a job registers only once its processes have registered
    # with an agent, so no job is taken for a lock-only one (whose switches move nothing).
    spec = GroupSpec(name="bench-agents", headroom_bytes=1 << 50, require_agent_registration=True)
    await stub.PutGroup(pb.PutGroupRequest(spec=group_spec_to_proto(spec)))
    deadline = time.monotonic() + 30
    while len((await stub.GetGroup(pb.GetGroupRequest(group="bench-agents"))).nodes) < agents:
        if time.monotonic() > deadline:
            raise RuntimeError("the bench's agents did not register with the scheduler")
        await asyncio.sleep(0.1)
    for job in ("ga", "gb"):
        for i in range(agents):
            socket = str(work / f"bench-{i}.sock")
            await _spawn(
                processes, env, "run", "--job", job, "--group", "bench-agents",
                "--agent-socket", socket, "--", "sleep", "3600",
            )  # fmt: skip
    return await _lease_calls(stub, "ga"), await _lease_calls(stub, "gb")


async def _spawn(
    processes: list[asyncio.subprocess.Process], env: dict[str, str], *args: str
) -> None:
    """Start `rlslice ARGS...` (its output dropped) and keep it in `processes`."""
    processes.append(
        await asyncio.create_subprocess_exec(
            *rlslice_argv(*args), env=env, stdout=asyncio.subprocess.DEVNULL
        )
    )


async def _lease_calls(stub: Any, job: str) -> _Calls:
    """Register `job` in `bench-agents` once an agent knows it: its Acquire and Yield
    requests under the lease."""
    import grpc

    from rlslice.v1alpha1 import scheduler_pb2 as pb

    request = pb.RegisterRequest(job=job, group="bench-agents", lease_seconds=600)
    deadline = time.monotonic() + 30
    while True:
        try:
            lease = await stub.Register(request)
            break
        except grpc.aio.AioRpcError as error:
            # FAILED_PRECONDITION: no agent knows the job yet (its `rlslice run` processes
            # are still starting); nothing else to wait on from outside the agents.
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            if time.monotonic() > deadline:
                why = error.details()
                raise RuntimeError(f"job {job}'s processes did not register: {why}") from None
            await asyncio.sleep(0.05)
    ids = {"job": job, "group": "bench-agents", "lease_id": lease.lease_id}
    return (
        pb.AcquireRequest(**ids, secret=lease.secret),
        pb.YieldRequest(**ids, secret=lease.secret),
    )
