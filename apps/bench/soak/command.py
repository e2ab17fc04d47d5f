"""`rlslice bench soak`: jobs take turns for minutes while jobs, agents and the scheduler are
killed and restarted at random; the event log is checked against the invariants afterwards.

    rlslice bench soak --minutes 10 --groups 10 --jobs 5 --seed 1 --json

Everything runs on loopback: an `rlslice scheduler` process (SQLite store), one `rlslice
agent` process per node (`sim` backend, one emulated device per group), and per job a
driver process with an `AsyncClient` and a GPU worker process (`_soak_job`). Each group
has a node (agent) of its own, whose device holds two jobs' state, so switches both
co-reside and evict. Faults come one at a time, a random kind each (the first three cover job, agent and
scheduler): SIGKILL of a job (driver and worker; it comes back under a new name), of an
agent or of the scheduler (each restarted after a short pause on the same files and port).

At the end every driver is stopped (SIGTERM), the system must drain to nothing (no job in
any group or on any agent, no emulated device or parked bytes left), and the event log is
checked (`_soak_check`): never two holders, every acquire answered, bytes after every
restore equal to the bytes before, epochs rising, no job stuck. It prints switches, kills,
restarts and violations; the exit status is 1 when there is any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True)
class SoakConfig:
    """What a soak runs and for how long."""

    seconds: float = 60.0
    groups: int = 10
    jobs: int = 5
    """Jobs per group."""
    seed: int = 0
    state_bytes: int = 1 * MiB
    """Emulated device memory of each job (filled with seeded bytes, hashed at every grant)."""
    rate_gbps: float = 2.0
    lease_seconds: float = 3.0
    min_phase: float = 0.1
    max_phase: float = 0.8
    fault_interval: float = 4.0
    """Mean seconds between faults (exponentially distributed)."""
    max_faults: int = 10_000
    acquire_timeout: float = 30.0
    partitions: bool = False
    """Add partitions to the faults: a job's driver cut off from the scheduler by an
    nftables rule on lo (its own group id) for 0.5 s to twice its lease, then healed
    (root and nft needed; the table is deleted at the end)."""
    out: Path | None = None
    """Folder for the event log and process logs; a temporary one when None."""


@dataclass
class _Job:
    name: str
    group: str
    node: str
    device: int
    process: subprocess.Popen[bytes]


@dataclass
class _Run:
    config: SoakConfig
    work: Path
    log_path: Path
    rng: random.Random
    cluster: Any
    log: Any
    jobs: dict[str, _Job] = field(default_factory=dict)
    generation: int = 0
    pending: set[asyncio.Task[None]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    nft: Any = None
    """The run's nftables table (partitions), else None."""
    gids: dict[str, int] = field(default_factory=dict)
    """Each job driver's group id (partitions)."""


def _group_layout(config: SoakConfig) -> tuple[list[str], dict[str, tuple[str, int]]]:
    """Node names, and for each group its node and device index there: one agent (node)
    per group, one emulated device each. (Groups sharing a node would share its devices'
    memory in the coordinator's co-residency arithmetic, which sizes whole nodes.)"""
    nodes = [f"n{i + 1}" for i in range(config.groups)]
    layout = {f"g{i}": (nodes[i], 0) for i in range(config.groups)}
    return nodes, layout


async def soak(config: SoakConfig) -> dict[str, Any]:
    """Run a soak; the report (figures and violations) as a dict."""
    from rlslice.apps.bench.soak.job import EventLog
    from rlslice.testing import Cluster

    temporary, work = _workdir(config)
    nodes, layout = _group_layout(config)
    devices = max(device for _, device in layout.values()) + 1
    cluster = Cluster(
        work / "cluster",
        nodes=nodes,
        capacity_bytes=config.state_bytes * 5 // 2,
        rate_gbps=config.rate_gbps,
        agent_args=("--sim-devices", str(devices)),
    )
    log_path = work / "events.jsonl"
    log_path.unlink(missing_ok=True)
    run = _Run(config, work, log_path, random.Random(config.seed), cluster, EventLog(str(log_path)))
    if config.partitions:
        run.nft = _open_partitions()
    started = time.monotonic()
    try:
        await cluster.start()
        await _configure_groups(run, layout)
        for group, (node, device) in sorted(layout.items()):
            for index in range(config.jobs):
                _start_job(run, f"{group}-j{index}", group, node, device)
        await _inject_faults(run, started + config.seconds)
        await _stop_jobs(run)
        await _drain(run)
    finally:
        _tear_down(run)
    result = _report(run, started, len(nodes), keep_log=temporary is None)
    if temporary is not None:
        temporary.cleanup()
    return result


def _workdir(config: SoakConfig) -> tuple[tempfile.TemporaryDirectory[str] | None, Path]:
    """`config.out`, made if missing, or a temporary folder (returned too, to clean up)."""
    if config.out is None:
        temporary = tempfile.TemporaryDirectory(prefix="rlslice-soak-")
        return temporary, Path(temporary.name)
    config.out.mkdir(parents=True, exist_ok=True)
    return None, config.out


def _open_partitions() -> Any:
    """The run's nftables table; the command stops, saying why, where it cannot have one."""
    from rlslice.apps.bench.soak.net import Nft, missing

    why = missing()
    if why is not None:
        raise SystemExit(f"rlslice bench soak --partitions: {why}")
    return Nft().open()


def _tear_down(run: _Run) -> None:
    for task in run.pending:
        task.cancel()
    for job in run.jobs.values():
        _kill_group(job.process)
    run.cluster.close()
    if run.nft is not None:
        run.nft.close()  # every rule it added goes with the table


def _report(run: _Run, started: float, nodes: int, *, keep_log: bool) -> dict[str, Any]:
    """The checked event log's figures and violations, the run's own problems among them."""
    from rlslice.apps.bench.soak.check import check

    lines = run.log_path.read_text().splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    report = check(events)
    report.violations.extend(run.problems)
    result = report.as_dict()
    result.update(
        seconds=round(time.monotonic() - started, 1),
        groups=run.config.groups,
        jobs_per_group=run.config.jobs,
        nodes=nodes,
        seed=run.config.seed,
        jobs_started=run.generation,
        events=len(events),
        event_log=str(run.log_path) if keep_log else None,
    )
    return result


async def _configure_groups(run: _Run, layout: dict[str, tuple[str, int]]) -> None:
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    async with open_channel(run.cluster.address) as channel:
        stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
        # A group with no nodes of its own lists every registered agent: wait for all.
        await stub.PutGroup(pb.PutGroupRequest(spec=pb.GroupSpec(name="probe")), timeout=10)
        await run.cluster.wait_agents_known("probe")
        await stub.DeleteGroup(pb.DeleteGroupRequest(group="probe"), timeout=10)
        for group, (node, _) in layout.items():
            spec = pb.GroupSpec(name=group, nodes=[node], lease_seconds=run.config.lease_seconds)
            await stub.PutGroup(pb.PutGroupRequest(spec=spec), timeout=10)


def _start_job(run: _Run, name: str, group: str, node: str, device: int) -> None:
    from rlslice.apps.bench.soak.job import driver_argv
    from rlslice.testing import child_env

    agent = run.cluster.agents[node]
    run.generation += 1
    c = run.config
    argv = driver_argv(
        scheduler=run.cluster.address,
        job=name,
        group=group,
        socket=str(agent.socket_path),
        node_dir=str(agent.node_dir),
        device=device,
        state_bytes=c.state_bytes,
        seed=run.rng.randrange(1 << 30),
        log=str(run.log_path),
        lease=c.lease_seconds,
        min_phase=c.min_phase,
        max_phase=c.max_phase,
        acquire_timeout=c.acquire_timeout,
    )
    extra: dict[str, Any] = {}
    if run.nft is not None:
        from rlslice.apps.bench.soak.net import fresh_gid

        run.gids[name] = fresh_gid()  # its sockets carry it: a rule can cut it off alone
        extra = {"group": run.gids[name], "extra_groups": []}
    with (run.work / "jobs.log").open("ab") as sink:
        process = subprocess.Popen(
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=child_env(),
            start_new_session=True,
            **extra,
        )
    run.jobs[name] = _Job(name, group, node, device, process)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a driver and its worker (they share the driver's process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


async def _inject_faults(run: _Run, until: float) -> None:
    kinds = ["job", "agent", "scheduler", *(["partition"] if run.nft is not None else [])]
    weights = [5, 3, 2, 4][: len(kinds)]
    done = 0
    while done < run.config.max_faults:
        pause = run.rng.expovariate(1.0 / run.config.fault_interval)
        if done < len(kinds):
            # The first of each kind comes early, so that even a short run on a loaded
            # machine kills a job, an agent and the scheduler.
            pause = min(pause, run.config.fault_interval)
        if time.monotonic() + pause >= until:
            await asyncio.sleep(max(0.0, until - time.monotonic()))
            return
        await asyncio.sleep(pause)
        kind = kinds[done] if done < len(kinds) else run.rng.choices(kinds, weights)[0]
        done += 1
        if kind == "job":
            await _kill_job(run)
        elif kind == "partition":
            _partition_job(run)
        else:
            await _kill_service(run, kind)


def _partition_job(run: _Run) -> None:
    """Cut a live driver off from the scheduler (its packets dropped), heal it later."""
    live = sorted(n for n, job in run.jobs.items() if job.process.poll() is None and n in run.gids)
    if not live:
        return
    name = run.rng.choice(live)
    port = int(run.cluster.address.rsplit(":", 1)[1])
    rule = run.nft.cut(run.gids[name], port)
    seconds = run.rng.uniform(0.5, 2 * run.config.lease_seconds)
    run.log("fault", kind="partition", target=name, seconds=seconds)

    async def heal() -> None:
        await asyncio.sleep(seconds)
        run.nft.heal(rule)
        run.log("healed", kind="partition", target=name)

    task = asyncio.ensure_future(heal())
    run.pending.add(task)
    task.add_done_callback(run.pending.discard)


async def _kill_job(run: _Run) -> None:
    live = sorted(name for name, job in run.jobs.items() if job.process.poll() is None)
    if not live:
        return
    name = run.rng.choice(live)
    job = run.jobs.pop(name)
    await asyncio.to_thread(_kill_group, job.process)
    run.log("fault", kind="job", target=name)

    async def come_back() -> None:
        await asyncio.sleep(run.rng.uniform(0.5, 2.0))
        base = name.split("-r")[0]
        _start_job(run, f"{base}-r{run.generation}", job.group, job.node, job.device)
        run.log("restarted", kind="job", target=name)

    task = asyncio.ensure_future(come_back())
    run.pending.add(task)
    task.add_done_callback(run.pending.discard)


async def _kill_service(run: _Run, kind: str) -> None:
    if kind == "scheduler":
        service, target = run.cluster.scheduler, "scheduler"
    else:
        target = run.rng.choice(sorted(run.cluster.agents))
        service = run.cluster.agents[target].service
    await asyncio.to_thread(service.kill, signal.SIGKILL)
    run.log("fault", kind=kind, target=target)
    await asyncio.sleep(run.rng.uniform(0.3, 2.0))
    await service.restart()
    run.log("restarted", kind=kind, target=target)


async def _stop_jobs(run: _Run) -> None:
    """SIGTERM every driver; each cancels a waiting acquire, yields, closes its client."""
    for task in list(run.pending):
        await asyncio.gather(task, return_exceptions=True)
    for job in run.jobs.values():
        with contextlib.suppress(ProcessLookupError):
            job.process.send_signal(signal.SIGTERM)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + run.config.max_phase * 2 + 30
    for job in list(run.jobs.values()):
        try:
            await asyncio.to_thread(job.process.wait, max(0.0, give_up - loop.time()))
        except subprocess.TimeoutExpired:
            run.problems.append(f"{job.name}: driver did not stop within 30 s of SIGTERM")
        _kill_group(job.process)


async def _drain(run: _Run) -> None:
    """Once every job is gone, nothing may be left: no job in a group or on an agent, no
    device or parked bytes (dead jobs' leases lapse, agents release their state)."""
    from rlslice.adapters.auth import local_agent_token
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import agent_pb2 as apb
    from rlslice.v1alpha1 import agent_pb2_grpc, scheduler_pb2_grpc
    from rlslice.v1alpha1 import scheduler_pb2 as pb

    async def leftovers() -> list[str]:
        found = []
        async with open_channel(run.cluster.address) as channel:
            stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
            for status in (await stub.ListGroups(pb.ListGroupsRequest(), timeout=10)).groups:
                if status.jobs or status.holder or status.queue:
                    jobs = [j.job for j in status.jobs]
                    found.append(f"{status.spec.name}: jobs {jobs} left in the scheduler")
        for node, agent in run.cluster.agents.items():
            async with open_channel(agent.service.address, token=local_agent_token()) as channel:
                astub: Any = agent_pb2_grpc.AgentStub(channel)
                status = await astub.Status(apb.AgentStatusRequest(), timeout=10)
                if status.jobs:
                    found.append(f"{node}: jobs {[j.job for j in status.jobs]} left on the agent")
        leaked = run.cluster.sim_bytes()
        if any(leaked.values()):
            found.append(f"sim bytes left: {leaked} in {run.cluster.sim_owners()}")
        return found

    loop = asyncio.get_running_loop()
    give_up = loop.time() + run.config.lease_seconds * 2 + 15
    while True:
        try:
            found = await leftovers()
        except Exception as error:  # a service that does not answer is a finding too
            found = [f"drain: {type(error).__name__}: {error}"]
        if not found or loop.time() > give_up:
            break
        await asyncio.sleep(0.5)
    run.problems.extend(f"not drained: {item}" for item in found)
    await _save_scheduler_events(run)


async def _save_scheduler_events(run: _Run) -> None:
    """Each group's recent scheduler events, beside the event log (for diagnosis)."""
    from google.protobuf.json_format import MessageToDict

    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    with contextlib.suppress(Exception):
        async with open_channel(run.cluster.address) as channel:
            stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
            groups = (await stub.ListGroups(pb.ListGroupsRequest(), timeout=10)).groups
            out = {}
            for status in groups:
                answer = await stub.GetEvents(pb.GetEventsRequest(group=status.spec.name))
                out[status.spec.name] = [
                    {k: v for k, v in MessageToDict(e).items() if k != "status"}
                    for e in answer.events
                ]
            (run.work / "scheduler-events.json").write_text(json.dumps(out, indent=1))


# -- the command --------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=1.0, help="how long (default 1)")
    parser.add_argument("--groups", type=int, default=10, help="groups (default 10)")
    parser.add_argument("--jobs", type=int, default=5, help="jobs per group (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--fault-interval", type=float, default=4.0, help="mean seconds between faults"
    )
    parser.add_argument(
        "--state-mib", type=float, default=1.0, help="device memory per job, MiB (default 1)"
    )
    parser.add_argument("--out", type=Path, default=None, help="keep the event log and logs here")
    parser.add_argument(
        "--partitions",
        action="store_true",
        help="also cut job drivers off from the scheduler for a while (nftables; root)",
    )


def run(args: argparse.Namespace) -> int:
    if not (0 < args.minutes <= 24 * 60 and 1 <= args.groups <= 100 and 1 <= args.jobs <= 20):
        print("rlslice bench soak: --minutes in (0, 1440], --groups 1-100, --jobs 1-20")
        return 2
    config = SoakConfig(
        seconds=args.minutes * 60,
        groups=args.groups,
        jobs=args.jobs,
        seed=args.seed,
        fault_interval=args.fault_interval,
        state_bytes=max(4096, math.ceil(args.state_mib * MiB)),
        partitions=args.partitions,
        out=args.out,
    )
    report = asyncio.run(soak(config))
    if args.json:
        print(json.dumps({"config": _jsonable(asdict(config)), **report}))
    else:
        print(
            f"soak {report['seconds']} s, {config.groups} groups x {config.jobs} jobs, "
            f"seed {config.seed}: {report['grants']} grants, {report['switches']} switches, "
            f"{report['hash_checks']} byte checks, kills {report['kills']}, "
            f"partitions {report['partitions']}, fenced {report['fenced']}, "
            f"restarts {report['restarts']}, violations {report['violations']}"
        )
        for line in report["violation_details"]:
            print(f"  violation: {line}")
    return 1 if report["violations"] else 0


def _jsonable(value: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in value.items()}
