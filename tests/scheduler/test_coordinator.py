"""Switches over real gRPC agents: small Agent servicers written here (test doubles at the
protocol boundary), three nodes, a live scheduler.

Cases: a switch snapshots the outgoing job on all three nodes, then restores the incoming
one, and the grant reports restored and moved bytes; an incoming job that fits beside the
resident one is granted without any snapshot (co-residency); one unreachable node -> the
snapshots that succeeded are rolled back, the switch is retried once, the waiter fails
ABORTED naming the node, and the outgoing job runs on; a node refusing the snapshot ->
FAILED_PRECONDITION; a restore that keeps failing -> the job is FAULTED with the reason and
the next waiter is served; a group's `nodes` limits the switch to those agents; a scheduler stopped after the
snapshot and before the restore completes the switch when it starts again on its file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from rlslice.config import GroupSpec
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc
from rlslice.v1alpha1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from conftest import Live

GIB = 1 << 30
FAST = {"agent_retries": 1, "retry_backoff_seconds": 0.01, "rpc_timeout_seconds": 2.0}


@dataclass
class FakeJob:
    state: int = apb.AGENT_JOB_STATE_RUNNING
    device: int = 0
    host: int = 0


@dataclass
class FakeAgent(agent_pb2_grpc.AgentServicer):
    """One node: jobs with device/host bytes, one device of `total` bytes, a call log."""

    node: str
    total: int = 10 * GIB
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    calls: list[tuple[str, str, int]] = field(default_factory=list)
    releases: list[tuple[str, bool]] = field(default_factory=list)
    fail: dict[str, grpc.StatusCode] = field(default_factory=dict)
    block_restore: asyncio.Event | None = None
    restore_entered: asyncio.Event = field(default_factory=asyncio.Event)
    address: str = ""

    async def Snapshot(self, request: Any, context: Any) -> apb.MoveResult:
        self.calls.append(("snapshot", request.job, request.epoch))
        if "snapshot" in self.fail:
            await context.abort(self.fail["snapshot"], f"{self.node} refuses")
        job = self.jobs[request.job]
        moved, job.host, job.device = job.device, job.device, 0
        job.state = apb.AGENT_JOB_STATE_PARKED
        return apb.MoveResult(job=request.job, state=job.state, bytes=moved, epoch=request.epoch)

    async def Restore(self, request: Any, context: Any) -> apb.MoveResult:
        self.calls.append(("restore", request.job, request.epoch))
        self.restore_entered.set()
        if self.block_restore is not None:
            await self.block_restore.wait()
        if "restore" in self.fail:
            await context.abort(self.fail["restore"], f"{self.node}: bytes do not fit")
        job = self.jobs[request.job]
        moved, job.device, job.host = job.host, job.host, 0
        job.state = apb.AGENT_JOB_STATE_RUNNING
        return apb.MoveResult(job=request.job, state=job.state, bytes=moved, epoch=request.epoch)

    async def Status(self, request: Any, context: Any) -> apb.AgentStatus:
        used = sum(j.device for j in self.jobs.values())
        return apb.AgentStatus(
            node=self.node,
            jobs=[
                apb.AgentJob(
                    job=n, group="g", state=j.state, device_bytes=j.device, host_bytes=j.host
                )
                for n, j in self.jobs.items()
            ],
            devices=[apb.Device(index=0, used_bytes=used, total_bytes=self.total)],
        )

    async def Release(self, request: Any, context: Any) -> apb.ReleaseResponse:
        self.releases.append((request.job, request.force))
        return apb.ReleaseResponse(released=request.force)

    def moves(self) -> list[tuple[str, str]]:
        return [(kind, job) for kind, job, _ in self.calls]


@pytest.fixture
async def agents() -> AsyncIterator[list[FakeAgent]]:
    """Three agents on loopback, each running job a with 6 GiB on its device."""
    fakes = [FakeAgent(f"n{i}", jobs={"a": FakeJob(device=6 * GIB)}) for i in (1, 2, 3)]
    servers = []
    for fake in fakes:
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServicer_to_server(fake, server)
        fake.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        servers.append(server)
    yield fakes
    for server in servers:
        await server.stop(0)


async def _join(live: Live, fakes: list[FakeAgent]) -> None:
    for fake in fakes:
        answer = await live.stub.RegisterAgent(
            pb.RegisterAgentRequest(node=fake.node, address=fake.address, backends=["sim"])
        )
        assert "g" in answer.groups or not live.engine.groups


async def _two_jobs(live: Live, fakes: list[FakeAgent]) -> tuple[Any, Any]:
    """a holds g (running 6 GiB everywhere); b is registered, expecting 6 GiB per node."""
    live.engine.put_group(GroupSpec(name="g"))
    await _join(live, fakes)
    a = await live.register("a", device_bytes=6 * GIB)
    b = await live.register("b", device_bytes=6 * GIB)
    await live.acquire("a", a)
    return a, b


async def test_a_switch_snapshots_everywhere_then_restores_everywhere(
    start_live: Callable[..., Any], agents: list[FakeAgent]
) -> None:
    async with start_live(**FAST) as live:
        a, b = await _two_jobs(live, agents)
        waiting = asyncio.ensure_future(live.acquire("b", b))
        await live.waiting("b")
        await live.yield_("a", a)
        grant = await asyncio.wait_for(waiting, 5)
        assert grant.restored is False  # b never ran: nothing to restore
        assert grant.moved_bytes == 3 * 6 * GIB
        for fake in agents:
            assert fake.moves() == [("snapshot", "a")]
            fake.jobs["b"] = FakeJob(device=6 * GIB)  # b allocates its memory
        status = await live.group()
        assert (list(status.parked), list(status.resident)) == (["a"], ["b"])
        assert list(status.nodes) == ["n1", "n2", "n3"]
        again = asyncio.ensure_future(live.acquire("a", a))
        await live.waiting("a")
        await live.yield_("b", b)
        grant = await asyncio.wait_for(again, 5)
        assert grant.restored is True
        assert grant.moved_bytes == 3 * 2 * 6 * GIB
        for fake in agents:
            assert fake.moves() == [("snapshot", "a"), ("snapshot", "b"), ("restore", "a")]
            epochs = {epoch for kind, _, epoch in fake.calls[1:]}
            assert epochs == {grant.epoch - 1}  # the switch's epoch, one below the grant's


async def test_an_incoming_job_that_fits_is_granted_without_eviction(
    start_live: Callable[..., Any], agents: list[FakeAgent]
) -> None:
    for fake in agents:
        fake.total = 16 * GIB
    async with start_live(**FAST) as live:
        a, b = await _two_jobs(live, agents)
        waiting = asyncio.ensure_future(live.acquire("b", b))
        await live.waiting("b")
        await live.yield_("a", a)
        grant = await asyncio.wait_for(waiting, 5)
        assert grant.moved_bytes == 0
        assert all(fake.calls == [] for fake in agents)
        assert list((await live.group()).resident) == ["a", "b"]


@pytest.mark.parametrize(
    ("how", "code"),
    [
        ("unreachable", grpc.StatusCode.ABORTED),
        ("refuses", grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
async def test_a_failing_node_rolls_the_snapshot_back_and_the_waiter_gets_a_reason(
    start_live: Callable[..., Any], agents: list[FakeAgent], how: str, code: grpc.StatusCode
) -> None:
    if how == "unreachable":
        agents[2].address = "127.0.0.1:1"  # nothing listens there
    else:
        agents[2].fail["snapshot"] = grpc.StatusCode.INTERNAL
    async with start_live(**FAST) as live:
        a, b = await _two_jobs(live, agents)
        waiting = asyncio.ensure_future(live.acquire("b", b))
        await live.waiting("b")
        await live.yield_("a", a)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(waiting, 10)
        assert caught.value.code() == code
        assert "node n3" in (caught.value.details() or "")
        for fake in agents[:2]:
            # Two attempts, each snapshot rolled back by a restore with its rollback epoch.
            assert fake.moves() == [("snapshot", "a"), ("restore", "a")] * 2
            assert fake.calls[1][2] == fake.calls[0][2] + 1
            assert fake.jobs["a"].state == apb.AGENT_JOB_STATE_RUNNING
        status = await live.group()
        assert list(status.resident) == ["a"]
        assert list(status.parked) == []
        assert status.holder == ""
        assert (await live.acquire("a", a)).job == "a"  # a runs on


async def test_a_restore_that_keeps_failing_faults_the_job_and_serves_the_next(
    start_live: Callable[..., Any], agents: list[FakeAgent]
) -> None:
    async with start_live(**FAST) as live:
        a, b = await _two_jobs(live, agents)
        c = await live.register("c", device_bytes=1)
        waiting = asyncio.ensure_future(live.acquire("b", b))
        await live.waiting("b")
        await live.yield_("a", a)
        await asyncio.wait_for(waiting, 5)
        for fake in agents:
            fake.jobs["b"] = FakeJob(device=6 * GIB)
        agents[1].fail["restore"] = grpc.StatusCode.RESOURCE_EXHAUSTED
        back = asyncio.ensure_future(live.acquire("a", a))
        await live.waiting("a")
        then = asyncio.ensure_future(live.acquire("c", c))
        await live.waiting("c")
        await live.yield_("b", b)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(back, 10)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "FAULTED" in (caught.value.details() or "")
        assert (await asyncio.wait_for(then, 5)).job == "c"
        status = await live.group()
        faulted = {j.job: j for j in status.jobs}["a"]
        assert faulted.state == pb.JOB_STATE_FAULTED
        assert "bytes do not fit" in faulted.reason
        assert status.phase == "Degraded"


async def test_a_groups_nodes_limit_the_switch_to_those_agents(
    start_live: Callable[..., Any], agents: list[FakeAgent]
) -> None:
    async with start_live(**FAST) as live:
        a, b = await _two_jobs(live, agents)
        live.engine.put_group(GroupSpec(name="g", nodes=("n1", "n2")))
        waiting = asyncio.ensure_future(live.acquire("b", b))
        await live.waiting("b")
        await live.yield_("a", a)
        await asyncio.wait_for(waiting, 5)
        assert [bool(fake.calls) for fake in agents] == [True, True, False]


async def test_a_switch_cut_by_a_restart_is_completed_on_start(
    start_live: Callable[..., Any], agents: list[FakeAgent], tmp_path: Path
) -> None:
    path = str(tmp_path / "state.db")
    for fake in agents:
        fake.jobs["b"] = FakeJob(state=apb.AGENT_JOB_STATE_PARKED, host=6 * GIB)
        fake.block_restore = asyncio.Event()
    async with start_live(store=path, **FAST) as live:
        a, b = await _two_jobs(live, agents)
        waiting = asyncio.ensure_future(live.acquire("b", b))
        await live.waiting("b")
        await live.yield_("a", a)
        await asyncio.wait_for(asyncio.gather(*(f.restore_entered.wait() for f in agents)), 5)
        switch = live.engine.groups["g"].state.switch
        assert switch is not None
    with pytest.raises(grpc.aio.AioRpcError):
        await waiting
    for fake in agents:
        assert fake.jobs["a"].state == apb.AGENT_JOB_STATE_PARKED  # snapshot done, restore cut
        fake.block_restore = None
    async with start_live(store=path, **FAST) as live:
        await live.until(lambda: live.engine.groups["g"].state.switch is None)
        status = await live.group()
        assert (list(status.parked), list(status.resident)) == (["a"], ["b"])
        assert status.epoch == switch.rollback_epoch
        # b was served before the restart: it keeps its turn and holds, though it has not
        # called again yet (its client, re-issuing Acquire, reads ALREADY_EXISTS as granted).
        assert status.holder == "b"
        for fake in agents:
            assert fake.jobs["b"].state == apb.AGENT_JOB_STATE_RUNNING
            assert fake.calls[-1] == ("restore", "b", switch.epoch)  # same epoch: idempotent
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await live.acquire("b", b)
        assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
