"""Overlapped and prefetched switches through a live scheduler and two real agents
(`sim`, real job processes really frozen), on loopback.

Case matrix:
- full devices (two 24 MiB jobs never fit together in 40 MiB): the switch is one Switch
  call per node, the incoming job's bytes admitted as the outgoing job's leave; the grant
  says restored; the outgoing job is frozen and parked on both nodes; bytes identical
- room beside the holder: the head waiter is prefetched while the holder runs (neither is
  frozen); the yield grants it at once with nothing moved on its path; the holder stays
  resident; the timeline has the prefetch; the metrics count it
- no room beside the holder, found by the waiter's prefetch: the switch at the yield is
  planned without asking the agents' Status again (it evicts every resident job anyway);
  a switch with nothing learnt before asks every agent; a third job, parked, is left alone
  by such a switch (no second snapshot, which its agents would refuse)
- one node's restore fails (its buffer gone): the other node is switched back, the
  outgoing job runs on both nodes with its bytes, the waiter fails and is FAULTED
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.config import GroupSpec
from rlslice.snapshot_agent import AgentSettings, RunningAgent, SimSettings, start_agent
from rlslice.snapshot_agent.backends import _simfs
from rlslice.snapshot_agent.state import Move
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .conftest import Live, live_scheduler

JOBPROC = Path(__file__).parents[1] / "snapshot_agent" / "jobproc.py"
MiB = 1 << 20
NODES = ("n1", "n2")
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None


def proc_state(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text[text.rfind(")") + 2]


class Job:
    """One jobproc.py process on one node."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.info: dict[str, Any] = {}

    async def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert line, "the job process ended"
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def hash(self) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(b"hash\n")
        await self.process.stdin.drain()
        return str((await self.read())["hash"])

    @property
    def state(self) -> str:
        return proc_state(self.process.pid)


class Cluster:
    def __init__(self, live: Live, agents: dict[str, RunningAgent]) -> None:
        self.live, self.agents = live, agents
        self.jobs: dict[tuple[str, str], Job] = {}
        self.leases: dict[str, Any] = {}

    async def spawn(self, job: str, seed: int) -> None:
        for node, agent in self.agents.items():
            process = await asyncio.create_subprocess_exec(
                sys.executable, str(JOBPROC), str(agent.socket_path),
                str(agent.settings.sim.root / node), job, "g", str(24 * MiB), "--seed", str(seed),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            proc = Job(process)
            self.jobs[(job, node)] = proc
            proc.info = await proc.read()

    async def acquire(self, job: str) -> Any:
        if job not in self.leases:
            self.leases[job] = await self.live.register(job, device_bytes=24 * MiB)
        return await self.live.acquire(job, self.leases[job])

    async def park(self, job: str, epoch: int) -> None:
        """Park `job` by hand on every node (as if it ran before and was switched out)."""
        for agent in self.agents.values():
            await agent.engine.move(Move.SNAPSHOT, job, "g", epoch)

    def kill(self) -> None:
        for proc in self.jobs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.process.pid, signal.SIGCONT)
                os.kill(proc.process.pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def cluster(capacity: int) -> AsyncIterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="rlslice-test-", dir=SHM))
    short = Path(tempfile.mkdtemp(prefix="ro-", dir="/tmp"))
    fast = {"agent_retries": 1, "retry_backoff_seconds": 0.01, "rpc_timeout_seconds": 20.0}
    try:
        async with live_scheduler(**fast) as live:
            live.engine.put_group(GroupSpec(name="g"))
            agents: dict[str, RunningAgent] = {}
            try:
                for node in NODES:
                    agents[node] = await start_agent(
                        AgentSettings(
                            node=node,
                            state_dir=short / f"state-{node}",
                            socket_path=short / f"{node}.sock",
                            host_reserve_bytes=0,
                            sim=SimSettings(root=root, capacity_bytes=capacity, rate_gbps=0.0),
                            backend_options={"sim": {"chunk_bytes": str(MiB)}},
                        )
                    )
                    await live.stub.RegisterAgent(
                        pb.RegisterAgentRequest(
                            node=node, address=agents[node].address, backends=["sim"]
                        )
                    )
                assert set(live.engine.runner.agents) == set(NODES)
                made = Cluster(live, agents)
                try:
                    yield made
                finally:
                    made.kill()
            finally:
                for agent in agents.values():
                    await agent.stop(0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(short, ignore_errors=True)


class SwitchSpy:
    """Counts each agent's Switch calls and whether their restores overlapped."""

    def __init__(self, agents: dict[str, RunningAgent]) -> None:
        self.calls: list[tuple[str, bool]] = []
        for node, agent in agents.items():
            engine = agent.engine
            real = engine.switch

            async def spy(*args: Any, _real: Any = real, _node: str = node, **kw: Any) -> Any:
                reply = await _real(*args, **kw)
                self.calls.append((_node, reply.overlapped))
                return reply

            engine.switch = spy  # type: ignore[method-assign]


class StatusSpy:
    """Counts each agent's Status calls."""

    def __init__(self, agents: dict[str, RunningAgent]) -> None:
        self.calls: list[str] = []
        for node, agent in agents.items():
            engine = agent.engine
            real = engine.status

            async def spy(_real: Any = real, _node: str = node) -> Any:
                self.calls.append(_node)
                return await _real()

            engine.status = spy  # type: ignore[method-assign]


async def prefetch_ended(events: asyncio.Queue[Any]) -> Any:
    """The group's next event that ends a prefetch attempt ("done", "skipped: ...",
    "failed: ..."), read from a watch queue: woken by events, never by sleeping."""
    while True:
        entry = await asyncio.wait_for(events.get(), 30)
        assert entry is not None
        if entry.kind == "prefetch" and entry.detail != "started":
            return entry


async def _b_parked_a_holding(c: Cluster) -> None:
    """b held first and is parked; a holds. (a's process allocates at its start, so b is
    parked on the agents before a starts: the devices may not hold both.)"""
    await c.spawn("b", seed=2)
    await c.acquire("b")
    await c.live.yield_("b", c.leases["b"])  # no waiter: b stays resident (deferred)
    await c.park("b", 1)
    await c.spawn("a", seed=1)
    await c.acquire("a")  # the switch to a finds b parked: the scheduler parks it too
    status = await c.live.group()
    assert status.holder == "a"
    assert list(status.parked) == ["b"]


async def test_a_switch_on_full_devices_overlaps_on_every_node() -> None:
    async with cluster(capacity=40 * MiB) as c:
        await _b_parked_a_holding(c)
        spy = SwitchSpy(c.agents)
        waiting = asyncio.ensure_future(c.acquire("b"))
        await c.live.waiting("b")
        assert spy.calls == []  # no room beside a: no prefetch moved anything
        await c.live.yield_("a", c.leases["a"])
        grant = await asyncio.wait_for(waiting, 60)

        assert grant.restored
        assert sorted(spy.calls) == [("n1", True), ("n2", True)]
        for node in NODES:
            assert c.jobs[("a", node)].state == "T"
            b = c.jobs[("b", node)]
            assert b.state != "T"
            assert await b.hash() == b.info["hash"]
        status = await c.live.group()
        assert list(status.parked) == ["a"]


async def test_the_switch_after_a_prefetch_found_no_room_asks_the_agents_no_status() -> None:
    """Full devices: b's prefetch finds no room beside a, so the switch at a's yield
    evicts a whatever the numbers are by then, and is planned without a Status round; it
    moves the same as one planned from fresh reports. A switch with nothing learnt before
    it (nobody held while the waiter queued, so no prefetch) asks every agent."""
    async with cluster(capacity=40 * MiB) as c:
        await _b_parked_a_holding(c)
        events = c.live.engine.watch("g")
        statuses = StatusSpy(c.agents)
        waiting = asyncio.ensure_future(c.acquire("b"))
        entry = await prefetch_ended(events)
        assert entry.detail.startswith("skipped"), entry.detail
        assert sorted(statuses.calls) == sorted(NODES)  # the prefetch asked, once each
        statuses.calls.clear()

        await c.live.yield_("a", c.leases["a"])
        grant = await asyncio.wait_for(waiting, 60)

        assert grant.restored
        assert statuses.calls == []
        for node in NODES:
            assert c.jobs[("a", node)].state == "T"
            b = c.jobs[("b", node)]
            assert b.state != "T"
            assert await b.hash() == b.info["hash"]
        assert list((await c.live.group()).parked) == ["a"]

        await c.live.yield_("b", c.leases["b"])  # no waiter: b stays on the devices
        await c.acquire("a")  # nobody holds: a switch at once, with no prefetch before
        assert sorted(statuses.calls) == sorted(NODES)
        for node in NODES:
            assert c.jobs[("b", node)].state == "T"
            a = c.jobs[("a", node)]
            assert await a.hash() == a.info["hash"]
        c.live.engine.unwatch("g", events)


async def test_a_switch_planned_without_status_leaves_a_parked_third_job_alone() -> None:
    """c parked, b parked, a holds, on full devices: b's prefetch finds no room, and the
    switch at a's yield, planned without a Status round, snapshots a only: c is parked
    already (a snapshot of it would be refused and fail the switch's first attempt)."""
    async with cluster(capacity=40 * MiB) as c:
        for job, seed in (("c", 3), ("b", 2), ("a", 1)):
            await c.spawn(job, seed=seed)
            await c.acquire(job)  # a switch that finds the one before parked parks it
            if job != "a":
                await c.live.yield_(job, c.leases[job])  # no waiter: stays resident
                await c.park(job, (await c.live.group()).epoch)
        assert sorted((await c.live.group()).parked) == ["b", "c"]
        events = c.live.engine.watch("g")
        statuses = StatusSpy(c.agents)
        waiting = asyncio.ensure_future(c.acquire("b"))
        ended = await prefetch_ended(events)
        assert ended.detail.startswith("skipped"), ended.detail
        seen = []
        statuses.calls.clear()

        await c.live.yield_("a", c.leases["a"])
        grant = await asyncio.wait_for(waiting, 60)
        while (entry := await asyncio.wait_for(events.get(), 30)) is not None:
            seen.append((entry.kind, entry.job, entry.detail))
            if entry.kind == "granted":
                break
        c.live.engine.unwatch("g", events)

        assert grant.restored
        assert statuses.calls == []
        assert not [e for e in seen if e[0] == "switch_failed"], seen
        assert sorted((await c.live.group()).parked) == ["a", "c"]
        for node in NODES:
            for job in ("a", "c"):
                assert c.jobs[(job, node)].state == "T"
            b = c.jobs[("b", node)]
            assert await b.hash() == b.info["hash"]


async def test_a_waiter_that_fits_is_prefetched_and_granted_at_once_at_the_yield() -> None:
    async with cluster(capacity=64 * MiB) as c:
        await _b_parked_a_holding(c)
        events = c.live.engine.watch("g")
        waiting = asyncio.ensure_future(c.acquire("b"))
        entry = await prefetch_ended(events)
        assert entry.detail == "done"
        assert entry.bytes == 2 * 24 * MiB
        for node in NODES:  # b is back on the devices while a still holds and runs
            assert c.jobs[("a", node)].state != "T"
            b = c.jobs[("b", node)]
            assert await b.hash() == b.info["hash"]
        assert not waiting.done()

        await c.live.yield_("a", c.leases["a"])
        grant = await asyncio.wait_for(waiting, 30)

        assert grant.restored
        assert grant.moved_bytes == 0  # nothing moved on the grant's path
        status = await c.live.group()
        assert status.holder == "b"
        assert list(status.parked) == []
        assert c.live.engine.metrics.prefetches.labels(group="g", outcome="done")._value.get() == 1
        c.live.engine.unwatch("g", events)


async def test_a_failed_restore_on_one_node_switches_the_other_back() -> None:
    async with cluster(capacity=40 * MiB) as c:
        await _b_parked_a_holding(c)
        node_dir = c.agents["n2"].settings.sim.root / "n2"
        for buffer in _simfs.job_buffers(node_dir, "b"):
            buffer.path.unlink()  # n2's restore of b fails (and its retry)
        waiting = asyncio.ensure_future(c.acquire("b"))
        await c.live.waiting("b")
        await c.live.yield_("a", c.leases["a"])
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await asyncio.wait_for(waiting, 60)
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        for node in NODES:  # switched back everywhere: a runs on with its bytes
            a = c.jobs[("a", node)]
            assert a.state != "T"
            assert await a.hash() == a.info["hash"]
        state = c.live.engine.groups["g"].state
        assert "b" in state.faulted
        assert "a" in state.resident
