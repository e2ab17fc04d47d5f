"""Fixtures for the fault-injection tests: real scheduler and agent processes on loopback
(`rlslice.testing.Cluster`), real job processes (`worker.py`), and the DESIGN.md
invariants checked against what the scheduler, the agents and /proc say.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.adapters.auth import local_agent_token
from rlslice.adapters.channel import open_channel
from rlslice.apps.bench.soak import scheduler as soak_scheduler
from rlslice.testing import Cluster, child_env
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc, scheduler_pb2_grpc
from rlslice.v1alpha1 import scheduler_pb2 as pb

from . import diskfault, netfault
from .diskfault import SmallFs
from .netfault import Nft

WORKER = Path(__file__).with_name("worker.py")
MiB = 1 << 20


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RLSLICE_"):
            monkeypatch.delenv(name)


def proc_state(pid: int) -> str:
    """One-letter scheduler state of `pid` ('T' when stopped), '' when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text[text.rfind(")") + 2]


class Proc:
    """A `worker.py` process: JSON commands in, JSON answers out."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.info: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def state(self) -> str:
        return proc_state(self.pid)

    async def read(self, timeout: float = 20.0) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        assert line, f"process {self.pid} ended"
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def call(self, timeout: float = 20.0, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        await self.process.stdin.drain()
        return await self.read(timeout)

    async def hash(self) -> str:
        answer = await self.call(op="hash")
        return str(answer["hash"])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    async def reap(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), 10)


@dataclass
class Faults:
    """A cluster, its job processes, and raw stubs to talk to the services."""

    cluster: Cluster
    procs: list[Proc] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.cluster.address

    @staticmethod
    async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
        """The first truthy value of `check()` (sync or async) within `timeout`, else fail."""
        return await eventually(check, timeout)

    async def worker(self, node: str, job: str, group: str = "g") -> Proc:
        """A GPU worker of `job` on `node`, registered with that node's agent."""
        agent = self.cluster.agents[node]
        return await self._spawn("worker", str(agent.socket_path), str(agent.node_dir), job, group)

    async def driver(
        self,
        job: str,
        group: str = "g",
        lease: float = 30.0,
        device_bytes: int = 0,
        gid: int | None = None,
    ) -> Proc:
        """A driver process of `job` holding its own `rlslice.Client`; `gid`: its group id
        (so an nftables rule can cut it off, see `netfault`)."""
        args = ("driver", self.address, job, group, str(lease), str(device_bytes))
        return await self._spawn(*args, gid=gid)

    async def _spawn(self, *args: str, gid: int | None = None) -> Proc:
        extra: dict[str, Any] = {} if gid is None else {"group": gid, "extra_groups": []}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=child_env(),
            **extra,
        )
        proc = Proc(process)
        self.procs.append(proc)
        proc.info = await proc.read()
        return proc

    @contextlib.asynccontextmanager
    async def scheduler_stub(self, timeout: float = 10.0) -> AsyncIterator[Any]:
        async with open_channel(self.address) as channel:
            yield scheduler_pb2_grpc.SchedulerStub(channel)

    async def group(self, name: str = "g") -> pb.GroupStatus:
        async with self.scheduler_stub() as stub:
            status: pb.GroupStatus = await stub.GetGroup(pb.GetGroupRequest(group=name), timeout=10)
            return status

    async def put_group(self, **spec: Any) -> None:
        async with self.scheduler_stub() as stub:
            await stub.PutGroup(pb.PutGroupRequest(spec=pb.GroupSpec(**spec)), timeout=10)
        await self.cluster.wait_agents_known(spec["name"])

    async def agent_status(self, node: str) -> apb.AgentStatus:
        address = self.cluster.agents[node].service.address
        async with open_channel(address, token=local_agent_token()) as channel:
            status: apb.AgentStatus = await agent_pb2_grpc.AgentStub(channel).Status(
                apb.AgentStatusRequest(), timeout=10
            )
            return status

    async def _settled(self) -> bool:
        """No agent that answers is moving a job right now (a killed one moves nothing)."""
        for node in self.cluster.agents:
            try:
                status = await self.agent_status(node)
            except grpc.aio.AioRpcError:
                continue
            if any(e.state in _MOVING for e in status.jobs):
                return False
        return True

    async def agent_job(self, node: str, job: str) -> apb.AgentJob | None:
        for entry in (await self.agent_status(node)).jobs:
            if entry.job == job:
                return entry
        return None

    async def check(self, group: str = "g", live: dict[str, list[Proc]] | None = None) -> None:
        """Assert the DESIGN.md invariants that a snapshot of the system can show.

        `live` maps each job to its worker processes that still run: a parked job's state
        must be parked on the agents (never dropped while the job lives), the holder's
        workers must run (not stopped), and epochs only rise between checks.
        """
        status = await self.group(group)
        queue = list(status.queue)
        # 1. at most one holder; the holder neither waits nor sits parked
        assert len(queue) == len(set(queue)), f"a job queued twice: {queue}"
        assert not status.holder or status.holder not in queue
        assert not set(status.resident) & set(status.parked), "resident and parked at once"
        if status.holder:
            assert status.holder in status.resident
        # 6. epochs only rise, through restarts too
        assert status.epoch >= self.epochs.get(group, 0), "the epoch went back"
        self.epochs[group] = status.epoch
        if status.phase == "Switching":
            return  # agents are mid-move: their view is checked once the switch ends
        if live:
            # A prefetch (the head waiter restored beside the holder) moves state while
            # the group is held: compare with the agents once no move is under way.
            await eventually(self._settled, 20)
            status = await self.group(group)
            if status.phase == "Switching":
                return
        for job, procs in (live or {}).items():
            running = [p for p in procs if p.state not in ("", "Z")]
            if job == status.holder:
                assert all(p.state != "T" for p in running), f"holder {job} is frozen"
            if job in status.parked and running:
                # 4. a parked job's state is kept while the job lives
                for node in self.cluster.agents:
                    entry = await self.agent_job(node, job)
                    if entry is not None and entry.pids:
                        assert entry.state == apb.AGENT_JOB_STATE_PARKED, (node, entry)
                        assert entry.host_bytes > 0, (node, entry)
                assert all(p.state == "T" for p in running), f"parked {job} runs"


_MOVING = (apb.AGENT_JOB_STATE_SAVING, apb.AGENT_JOB_STATE_RESTORING)


async def eventually(check: Callable[[], Any], timeout: float = 10.0, every: float = 0.05) -> Any:
    """The first truthy value of `check()` (sync or async) within `timeout`, else fail."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert loop.time() < give_up, "the condition never held"
        await asyncio.sleep(every)


@pytest.fixture
def faults(tmp_path: Path) -> Callable[..., contextlib.AbstractAsyncContextManager[Faults]]:
    """`async with faults(nodes=..., capacity_bytes=..., rate_gbps=...) as f:` a started
    cluster; every process is gone afterwards."""

    @contextlib.asynccontextmanager
    async def make(agent_rpc_timeout: float | None = None, **cluster: Any) -> AsyncIterator[Faults]:
        # `agent_rpc_timeout`: the scheduler's deadline for each Snapshot/Restore (and
        # Status) call to an agent, for tests that cut an agent off (default: production's).
        if agent_rpc_timeout is not None:
            cluster["scheduler_command"] = soak_scheduler.argv(agent_rpc_timeout)
        running = Cluster(tmp_path / "cluster", **cluster)
        made = Faults(running)
        try:
            await running.start()
            yield made
        finally:
            for proc in made.procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            for proc in made.procs:
                await proc.reap()
            running.close()

    return make


@pytest.fixture
def nft() -> Iterator[Nft]:
    """A table of nftables rules on lo for this test, deleted afterwards, pass or fail.

    Without root or nft the test skips; under CI (`CI=true`) it fails instead."""
    why = netfault.missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"kernel network faults are required in CI: {why}")
        pytest.skip(why)
    table = Nft().open()
    try:
        yield table
    finally:
        table.close()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[SmallFs]:
    """A 512 KiB tmpfs mounted for this test, unmounted afterwards, pass or fail.

    Without root the test skips; under CI (`CI=true`) it fails instead."""
    why = diskfault.missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"storage faults are required in CI: {why}")
        pytest.skip(why)
    fs = SmallFs(tmp_path / "fs").mount()
    try:
        yield fs
    finally:
        fs.close()
