"""A holder that is alive but cut off from the scheduler is fenced before anyone else runs.

Real `rlslice scheduler` and `rlslice agent` processes, real job processes (`worker.py`), a
real partition: an nftables rule on lo drops what the holder's driver sends to the
scheduler (matched by the driver's own group id), while its GPU worker runs on.

Cases:
- the partitioned holder's lease lapses; before the waiter (which would fit beside it) is
  granted, the holder's worker is fenced: frozen, its state parked on the agent; the grant's
  epoch (the fencing token) is above the lost one; the waiter is granted within the lease
  plus the switch time plus a margin;
- after the partition heals, its client queues it to bring its state home; the holder's
  phase raises LockLostError naming the lost epoch and takes it out of the queue; the job acquires again once the other yields, its worker runs again and its
  device state is byte for byte what it was (invariant 5); the rule is gone afterwards;
- a fenced holder whose driver makes no call after the heal (it waits for its frozen
  worker inside the phase): its client queues it again on its own, the grant restores the
  parked copy and resumes the worker, byte for byte; the phase then raises LockLostError at
  its exit and gives that group back;
- a fenced job that leaves instead (closes its client after LockLostError): its worker is
  resumed and its parked copy dropped, never left frozen (invariant 8), although its lease
  had lapsed (the client registers once more to unregister, which releases with force).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlslice.client import AsyncClient
from rlslice.v1alpha1 import agent_pb2 as apb

from . import netfault

if TYPE_CHECKING:
    from conftest import Faults
    from netfault import Nft

MiB = 1 << 20
STATE = 2 * MiB
LEASE = 2.0
#: Seconds beyond lease + switch the waiter may wait on a loaded 2-core machine.
MARGIN = 3.0


async def test_a_partitioned_holder_is_fenced_before_the_waiter_is_granted_and_resumes_intact(
    faults: Callable[..., Any], nft: Nft
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        gid = netfault.fresh_gid()
        driver_a = await f.driver("a", lease=LEASE, device_bytes=STATE, gid=gid)
        worker_a = await f.worker("n1", "a")
        entered = await driver_a.call(op="enter")
        assert entered["ok"], entered
        before = (await worker_a.call(op="init", size=STATE, seed=1))["hash"]
        async with AsyncClient(
            job="b", group="g", scheduler=f.address, lease_seconds=30, device_bytes=STATE
        ) as b:
            waiting = asyncio.ensure_future(b.acquire(timeout=60))
            await f.eventually(lambda: _queued(f, "b"))
            rule = nft.cut(gid, int(f.address.rsplit(":", 1)[1]))
            cut = time.monotonic()
            grant = await waiting
            waited = time.monotonic() - cut
            # Fenced before b was granted: frozen, parked, not rolled back.
            assert worker_a.state == "T"
            entry = await f.agent_job("n1", "a")
            assert entry is not None
            assert entry.state == apb.AGENT_JOB_STATE_PARKED
            assert entry.host_bytes >= STATE
            assert grant.epoch > entered["epoch"]
            assert waited <= LEASE + grant.switch_seconds + MARGIN, waited
            status = await f.group()
            assert status.holder == "b"
            assert "a" not in {j.job for j in status.jobs}
            nft.heal(rule)
            await f.eventually(lambda: _queued(f, "a"), timeout=30)  # its client's homecoming
            lost = await driver_a.call(op="exit", timeout=30)
            assert lost["error"] == "LockLostError", lost
            assert lost["epoch"] == entered["epoch"]
            await f.eventually(lambda: _not_queued(f, "a"))  # the exit took it out
            again = asyncio.ensure_future(driver_a.call(op="enter", timeout=60))
            await f.eventually(lambda: _queued(f, "a"), timeout=30)
            assert worker_a.state == "T"  # still fenced while b holds
            await b.yield_()
            resumed = await again
            assert resumed["ok"], resumed
            assert resumed["epoch"] > grant.epoch
            assert worker_a.state != "T"
            assert await worker_a.hash() == before
            await f.check(live={"a": [worker_a]})
            assert (await driver_a.call(op="exit"))["ok"]
        assert "skgid" not in nft.rules()


async def test_a_fenced_holder_that_makes_no_call_is_brought_home_by_its_client_after_the_heal(
    faults: Callable[..., Any], nft: Nft
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        gid = netfault.fresh_gid()
        driver_a = await f.driver("a", lease=LEASE, device_bytes=STATE, gid=gid)
        worker_a = await f.worker("n1", "a")
        entered = await driver_a.call(op="enter")
        assert entered["ok"], entered
        before = (await worker_a.call(op="init", size=STATE, seed=1))["hash"]
        async with AsyncClient(job="b", group="g", scheduler=f.address, lease_seconds=30) as b:
            waiting = asyncio.ensure_future(b.acquire(timeout=60))
            await f.eventually(lambda: _queued(f, "b"))
            rule = nft.cut(gid, int(f.address.rsplit(":", 1)[1]))
            grant = await waiting
            assert worker_a.state == "T"  # fenced
            nft.heal(rule)
            # No call of the driver's: its keep-alive finds the lease unknown and queues it.
            await f.eventually(lambda: _queued(f, "a"), timeout=30)
            assert worker_a.state == "T"  # still fenced while b holds
            await b.yield_()
            await f.eventually(lambda: worker_a.state not in ("T", ""), 30)
            assert await worker_a.hash() == before
            status = await f.group()
            assert status.holder == "a"
            assert status.epoch > grant.epoch
            lost = await driver_a.call(op="exit", timeout=30)
            assert lost["error"] == "LockLostError", lost
            assert lost["epoch"] == entered["epoch"]
            assert (await f.group()).holder == ""  # the homecoming's hold was given back
            again = await driver_a.call(op="enter", timeout=30)
            assert again["ok"], again
            assert again["epoch"] > status.epoch
            assert (await driver_a.call(op="exit"))["ok"]
            await f.check(live={"a": [worker_a]})
        assert "skgid" not in nft.rules()


async def test_a_fenced_job_that_leaves_is_resumed_not_left_frozen(
    faults: Callable[..., Any], nft: Nft
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        gid = netfault.fresh_gid()
        driver_a = await f.driver("a", lease=LEASE, device_bytes=STATE, gid=gid)
        worker_a = await f.worker("n1", "a")
        assert (await driver_a.call(op="enter"))["ok"]
        await worker_a.call(op="init", size=STATE, seed=1)
        async with AsyncClient(job="b", group="g", scheduler=f.address, lease_seconds=30) as b:
            waiting = asyncio.ensure_future(b.acquire(timeout=60))
            await f.eventually(lambda: _queued(f, "b"))
            rule = nft.cut(gid, int(f.address.rsplit(":", 1)[1]))
            await waiting
            assert worker_a.state == "T"  # fenced
            nft.heal(rule)
            assert (await driver_a.call(op="exit", timeout=30))["error"] == "LockLostError"
            assert (await driver_a.call(op="quit", timeout=60))["ok"]  # closes its client
            await f.eventually(lambda: worker_a.state not in ("T", ""), 20)
            await f.eventually(lambda: _not_parked(f, "a"), 20)
            await b.yield_()


async def _not_parked(f: Faults, job: str) -> bool:
    entry = await f.agent_job("n1", job)
    return entry is None or entry.state != apb.AGENT_JOB_STATE_PARKED


async def _not_queued(f: Faults, job: str) -> bool:
    return job not in (await f.group()).queue


async def _queued(f: Faults, job: str) -> bool:
    return job in (await f.group()).queue
