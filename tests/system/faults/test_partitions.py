"""Partitions on loopback, made with real nftables rules (`netfault.Nft`), healed after.

Real `rlslice scheduler` (its agent calls given a 3 s deadline) and `rlslice agent`
processes, real job workers (`worker.py`), `sim` backend with a slow copy (so a switch takes
about a second and can be cut in the middle).

Cases:
- scheduler <-> agent cut mid-snapshot and mid-restore (every packet to and from the
  agent's port dropped while the switch runs): the waiter fails with ABORTED naming the
  node within two attempts' deadlines (the bound the docs state); after the heal the
  outgoing job acquires first and is not granted frozen (the node parked it: the scheduler
  counts it parked and restores it), then the other; both workers' bytes are intact, no
  two jobs ever hold, every parked state is where the agent says;
- scheduler <-> waiter cut (the waiting driver's packets dropped, matched by its gid): its
  lease lapses and it leaves the queue within the lease plus a second; the holder's yield
  finds no waiter; after the heal the waiter's acquire is answered (granted after it
  registers again, or failed with a reason), never left hanging.
(scheduler <-> holder: `test_fencing.py`.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from rlslice import AbortedError
from rlslice.client import AsyncClient
from rlslice.v1alpha1 import agent_pb2 as apb

from . import netfault
from .conftest import eventually

if TYPE_CHECKING:
    from conftest import Faults
    from netfault import Nft

MiB = 1 << 20
STATE = 4 * MiB
RPC_TIMEOUT = 3.0
#: Two switch attempts, each a Status and a Switch call cut off at RPC_TIMEOUT, plus room
#: for a loaded 2-core machine.
SWITCH_BOUND = 2 * 2 * RPC_TIMEOUT + 6.0
LEASE = 2.0


@pytest.mark.parametrize("stage", ["snapshot", "restore"])
async def test_a_switch_cut_off_from_its_agent_fails_with_a_reason_and_loses_nothing(
    faults: Callable[..., Any], nft: Nft, stage: str
) -> None:
    cluster = {"capacity_bytes": 6 * MiB, "rate_gbps": 0.004, "agent_rpc_timeout": RPC_TIMEOUT}
    async with faults(**cluster) as f:
        await f.put_group(name="g")
        worker_a, worker_b = await f.worker("n1", "a"), await f.worker("n1", "b")
        port = int(f.cluster.agents["n1"].service.address.rsplit(":", 1)[1])
        async with _client(f, "a") as a, _client(f, "b") as b:
            await a.acquire()
            hash_a = (await worker_a.call(op="init", size=STATE, seed=1))["hash"]
            await a.yield_()
            await b.acquire()  # a is parked: both do not fit
            hash_b = (await worker_b.call(op="init", size=STATE, seed=2))["hash"]
            waiting = asyncio.ensure_future(a.acquire(timeout=60))
            await eventually(lambda: _queued(f, "a"))
            await b.yield_()
            if stage == "snapshot":  # b's worker stops as its snapshot starts
                await eventually(lambda: worker_b.state == "T", 10, every=0.005)
            else:
                await eventually(lambda: _restoring(f, "a"), 10, every=0.005)
            rules = nft.cut_link(port)
            cut = time.monotonic()
            with pytest.raises(AbortedError, match="node n1"):
                await waiting
            assert time.monotonic() - cut <= SWITCH_BOUND
            for rule in rules:
                nft.heal(rule)
            # The outgoing job first: wherever the cut left it, it must not hold frozen.
            back = await b.acquire(timeout=30)
            assert worker_b.state != "T", "b was granted while frozen"
            assert await worker_b.hash() == hash_b
            await f.check(live={"a": [worker_a], "b": [worker_b]})
            await b.yield_()
            again = await a.acquire(timeout=30)
            assert again.epoch > back.epoch
            assert worker_a.state != "T"
            assert await worker_a.hash() == hash_a
            await f.check(live={"a": [worker_a], "b": [worker_b]})
            await a.yield_()


async def test_a_waiter_cut_off_leaves_the_queue_and_is_answered_after_the_heal(
    faults: Callable[..., Any], nft: Nft
) -> None:
    async with faults() as f:
        await f.put_group(name="g")
        gid = netfault.fresh_gid()
        driver_b = await f.driver("b", lease=LEASE, gid=gid)
        async with _client(f, "a") as a:
            await a.acquire()
            waiting = asyncio.ensure_future(driver_b.call(70.0, op="acquire"))
            await eventually(lambda: _queued(f, "b"))
            rule = nft.cut(gid, int(f.address.rsplit(":", 1)[1]))
            cut = time.monotonic()
            await eventually(lambda: _gone(f, "b"), LEASE + 10)
            assert time.monotonic() - cut <= LEASE + 1.0 + 1.0
            assert (await a.yield_()).waiters == 0
            nft.heal(rule)
            answer = await asyncio.wait_for(waiting, 60)
            assert answer["ok"] or answer["error"], answer  # granted, or failed with a reason
            if answer["ok"]:
                assert (await f.group()).holder == "b"
                assert (await driver_b.call(op="yield"))["ok"]


def _client(f: Faults, job: str) -> AsyncClient:
    return AsyncClient(
        job=job, group="g", scheduler=f.address, lease_seconds=30, device_bytes=STATE
    )


async def _queued(f: Faults, job: str) -> bool:
    return job in (await f.group()).queue


async def _gone(f: Faults, job: str) -> bool:
    status = await f.group()
    return job not in {j.job for j in status.jobs} and job not in status.queue


async def _restoring(f: Faults, job: str) -> bool:
    entry = await f.agent_job("n1", job)
    return entry is not None and entry.state == apb.AGENT_JOB_STATE_RESTORING
