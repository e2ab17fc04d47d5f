"""Switches that cannot go through roll back; holders that overstay are preempted.

Real `rlslice scheduler` and `rlslice agent` processes, real job workers (sha256 of their
emulated device memory), `sim` backend.

Cases:
- one of three agents is unreachable (SIGKILLed) during a switch: the snapshots that
  succeeded are rolled back, the outgoing job keeps running on every node (no worker
  stopped, agents say RUNNING, bytes intact), the waiter gets AbortedError naming the
  node (not UNAVAILABLE, which clients retry as an outage) and is no longer queued; once the agent is back, the waiter's retry succeeds;
- a job declaring more device memory than the nodes' host memory could park is refused
  at registration with RESOURCE_EXHAUSTED and the group is unchanged;
- an agent whose host memory cannot take a snapshot refuses it: the waiter gets
  ResourceExhaustedError, the outgoing job keeps running, nothing moved;
- a holder past `max_hold_seconds` is asked to yield (its callback runs), then preempted
  after the grace period (its worker frozen, the waiter granted); its late yield is
  accepted and its next acquire restores its bytes intact.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from rlslice import AbortedError, ResourceExhaustedError
from rlslice.client import AsyncClient
from rlslice.v1alpha1 import agent_pb2 as apb

MiB = 1 << 20
STATE = 4 * MiB
NODES = ("n1", "n2", "n3")


async def test_an_unreachable_agent_rolls_the_switch_back_and_the_job_runs_on(
    faults: Callable[..., Any],
) -> None:
    async with faults(nodes=NODES, capacity_bytes=6 * MiB) as f:
        await f.put_group(name="g")
        workers_a = {n: await f.worker(n, "a") for n in NODES}
        workers_b = {n: await f.worker(n, "b") for n in NODES}
        async with (
            AsyncClient(job="a", group="g", scheduler=f.address, device_bytes=STATE) as a,
            AsyncClient(job="b", group="g", scheduler=f.address, device_bytes=STATE) as b,
        ):
            await a.acquire(timeout=30)
            hashes = {}
            for node, worker in workers_a.items():
                hashes[node] = (await worker.call(op="init", size=STATE, seed=1))["hash"]
            await a.yield_()
            f.cluster.agents["n3"].service.kill(signal.SIGKILL)

            with pytest.raises(AbortedError, match="node n3"):
                await b.acquire(timeout=30)
            status = await f.group()
            assert list(status.queue) == []  # the waiter was answered, not left queued
            assert status.holder == ""
            assert "a" in status.resident
            assert "a" not in status.parked
            for node in ("n1", "n2"):
                entry = await f.agent_job(node, "a")
                assert entry is not None
                assert entry.state == apb.AGENT_JOB_STATE_RUNNING, (node, entry)
            assert all(w.state not in ("T", "") for w in workers_a.values())
            for node, worker in workers_a.items():
                assert await worker.hash() == hashes[node]
            await f.check(live={"a": list(workers_a.values())})

            await f.cluster.agents["n3"].service.restart()
            grant = await _acquire_once_reachable(b, "n3")  # the retry goes through
            assert grant.moved_bytes >= 3 * STATE
            assert all(w.state == "T" for w in workers_a.values())
            await f.check(live={"a": list(workers_a.values()), "b": list(workers_b.values())})
            await b.yield_()
            await a.acquire(timeout=30)
            for node, worker in workers_a.items():
                assert await worker.hash() == hashes[node]
            await a.yield_()


async def test_a_job_too_big_to_park_is_refused_at_registration(
    faults: Callable[..., Any],
) -> None:
    async with faults() as f:
        await f.put_group(name="g")
        host = (await f.agent_status("n1")).host_available_bytes
        before = await f.group()
        async with AsyncClient(
            job="huge", group="g", scheduler=f.address, device_bytes=2 * host
        ) as huge:
            with pytest.raises(ResourceExhaustedError, match="host memory") as caught:
                await huge.acquire(timeout=10)
        assert "device_bytes" in str(caught.value)
        assert "\n" not in str(caught.value)
        after = await f.group()
        assert (list(after.jobs), after.epoch) == (list(before.jobs), before.epoch)
        async with AsyncClient(
            job="small", group="g", scheduler=f.address, device_bytes=STATE
        ) as small:
            await small.acquire(timeout=10)  # a job that fits is welcome
            await small.yield_()


async def test_a_snapshot_that_would_exhaust_host_memory_is_refused_and_the_job_runs_on(
    faults: Callable[..., Any],
) -> None:
    # The agents keep (nearly) all host memory in reserve: no snapshot can fit.
    async with faults(capacity_bytes=6 * MiB, host_reserve_bytes=1 << 50) as f:
        await f.put_group(name="g")
        worker_a = await f.worker("n1", "a")
        async with (
            AsyncClient(job="a", group="g", scheduler=f.address, device_bytes=STATE) as a,
            AsyncClient(job="b", group="g", scheduler=f.address, device_bytes=STATE) as b,
        ):
            await a.acquire(timeout=30)
            before = (await worker_a.call(op="init", size=STATE, seed=3))["hash"]
            await a.yield_()
            with pytest.raises(ResourceExhaustedError, match="a keeps running"):
                await b.acquire(timeout=30)
            entry = await f.agent_job("n1", "a")
            assert entry is not None
            assert entry.state == apb.AGENT_JOB_STATE_RUNNING
            assert entry.device_bytes == STATE
            assert worker_a.state != "T"
            assert await worker_a.hash() == before
            assert f.cluster.sim_bytes()["parked"] == 0
            status = await f.group()
            assert list(status.queue) == []
            assert "a" in status.resident
            await f.check(live={"a": [worker_a]})


async def test_a_holder_past_max_hold_is_asked_then_preempted_and_resumes_intact(
    faults: Callable[..., Any],
) -> None:
    async with faults(capacity_bytes=6 * MiB) as f:
        await f.put_group(name="g", max_hold_seconds=1.0, yield_grace_seconds=1.0)
        worker_a, worker_b = await f.worker("n1", "a"), await f.worker("n1", "b")
        asked: list[tuple[str, float]] = []
        async with (
            AsyncClient(
                job="a",
                group="g",
                scheduler=f.address,
                lease_seconds=1.5,
                device_bytes=STATE,
                on_yield_requested=lambda group, left: asked.append((group, left)),
            ) as a,
            AsyncClient(job="b", group="g", scheduler=f.address, device_bytes=STATE) as b,
        ):
            await a.acquire(timeout=30)
            before = (await worker_a.call(op="init", size=STATE, seed=4))["hash"]
            started = time.monotonic()
            grant = await b.acquire(timeout=30)  # a never yields
            waited = time.monotonic() - started
            assert 1.5 <= waited <= 2.0 + 1.0 + grant.switch_seconds, waited
            assert asked, "the holder was never asked to yield"
            assert asked[0][0] == "g"
            assert 0.0 <= asked[0][1] <= 1.0
            assert a.yield_requested()
            assert worker_a.state == "T"  # preempted: snapshotted while it believed it held
            status = await f.group()
            assert status.holder == "b"
            assert list(status.parked) == ["a"]
            await f.check(live={"a": [worker_a], "b": [worker_b]})
            await a.yield_()  # the late yield is accepted
            await b.yield_()
            regrant = await a.acquire(timeout=30)
            assert regrant.restored
            assert await worker_a.hash() == before
            await f.check(live={"a": [worker_a], "b": [worker_b]})
            await a.yield_()


async def _acquire_once_reachable(client: AsyncClient, node: str, timeout: float = 30.0) -> Any:
    """Acquire, trying again while the scheduler's channel to the restarted `node` is still
    in gRPC's reconnect backoff (its switches fail fast, ABORTED naming the node)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await client.acquire(timeout=timeout)
        except AbortedError as error:
            if f"node {node}" not in str(error) or loop.time() > deadline:
                raise
