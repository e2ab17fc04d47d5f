"""Jobs that die: the lock and the memory they held come back, and nothing else is lost.

Real `rlslice scheduler` and `rlslice agent` processes, real job processes (a driver with
its `rlslice.Client` and a GPU worker registered with the agent), `sim` backend.

Cases:
- the holder (driver and worker) is SIGKILLed while another job waits: the waiter is
  granted within the lease time plus the switch time; the dead job leaves the group and
  the agent (its device memory is freed);
- a parked job's driver is SIGKILLed: its lease lapses, yet its parked state stays on
  the agent while its frozen worker lives; once the worker is killed too, the agent frees
  the parked copy;
- a parked job that dies while its node's agent is down (the scheduler's Release finds no
  agent): the agent, back, drops the copy once its registration's answer shows the
  scheduler no longer knows the job;
- a waiting driver that is SIGKILLed leaves the queue at once (its connection drops),
  long before its lease would lapse;
- a job that ends (closes its client) while parked has its worker resumed, so that the
  worker can exit; its parked copy is freed;
- a job that leaves while its state is on the device (nobody waited at its yield) keeps
  that memory while its processes live: a restore that needs it fails with a reason, the
  waiting job's state stays parked, and once the processes exit the restore succeeds;
- a job that closes its client while parked, bringing its state home (`bring_home=True`), waits
  for its turn, gets its state back bit for bit, and is never snapshotted on its way out.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from rlslice import FailedPreconditionError
from rlslice.client import AsyncClient
from rlslice.v1alpha1 import agent_pb2 as apb

if TYPE_CHECKING:
    from conftest import Faults

MiB = 1 << 20
STATE = 8 * MiB
LEASE = 2.0


async def test_a_killed_holder_loses_the_lock_within_its_lease(
    faults: Callable[..., Any],
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        driver_a = await f.driver("a", lease=LEASE, device_bytes=STATE)
        worker_a = await f.worker("n1", "a")
        assert (await driver_a.call(op="acquire"))["ok"]
        await worker_a.call(op="init", size=STATE, seed=1)
        worker_b = await f.worker("n1", "b")
        async with AsyncClient(
            job="b", group="g", scheduler=f.address, lease_seconds=LEASE, device_bytes=STATE
        ) as b:
            waiting = asyncio.ensure_future(b.acquire(timeout=30))
            await f.eventually(lambda: _queued(f, "b"))
            killed = time.monotonic()
            driver_a.kill()
            worker_a.kill()
            grant = await waiting
            waited = time.monotonic() - killed
            assert waited <= LEASE + grant.switch_seconds + 1.0, waited
            status = await f.group()
            assert status.holder == "b"
            assert "a" not in {j.job for j in status.jobs}
            # The dead job's device memory is freed: b's state fits where a's was.
            assert (await worker_b.call(op="init", size=STATE, seed=2))["ok"]
            await f.eventually(lambda: _gone_from_agent(f, "a"))
            await f.check(live={"b": [worker_b]})
            await b.yield_()


async def test_a_dead_jobs_parked_state_is_kept_until_its_processes_are_gone(
    faults: Callable[..., Any],
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        driver_a = await f.driver("a", lease=LEASE, device_bytes=STATE)
        worker_a = await f.worker("n1", "a")
        assert (await driver_a.call(op="acquire"))["ok"]
        await worker_a.call(op="init", size=STATE, seed=1)
        assert (await driver_a.call(op="yield"))["ok"]
        async with AsyncClient(
            job="b", group="g", scheduler=f.address, lease_seconds=LEASE, device_bytes=STATE
        ) as b:
            await b.acquire(timeout=30)  # evicts a: parked, its worker frozen
            assert list((await f.group()).parked) == ["a"]
            assert worker_a.state == "T"
            await f.check(live={"a": [worker_a]})

            driver_a.kill()  # the job's driver dies; its frozen worker lives on
            await f.eventually(lambda: _left_group(f, "a"), timeout=LEASE + 5)
            await asyncio.sleep(0.5)  # the scheduler's Release reached the agent by now
            entry = await f.agent_job("n1", "a")
            assert entry is not None, "parked state dropped while the job's worker lives"
            assert entry.state == apb.AGENT_JOB_STATE_PARKED
            assert entry.host_bytes == STATE
            assert f.cluster.sim_bytes()["parked"] >= STATE

            worker_a.kill()  # now every process of the job is gone
            await f.eventually(lambda: _gone_from_agent(f, "a"))
            await f.eventually(lambda: f.cluster.sim_bytes()["parked"] == 0)
            await f.check()
            await b.yield_()


async def test_a_dead_jobs_parked_state_whose_release_the_agent_missed_is_dropped_when_it_returns(
    faults: Callable[..., Any],
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        driver_a = await f.driver("a", lease=LEASE, device_bytes=STATE)
        worker_a = await f.worker("n1", "a")
        assert (await driver_a.call(op="acquire"))["ok"]
        await worker_a.call(op="init", size=STATE, seed=1)
        assert (await driver_a.call(op="yield"))["ok"]
        async with AsyncClient(
            job="b", group="g", scheduler=f.address, lease_seconds=30, device_bytes=STATE
        ) as b:
            await b.acquire(timeout=30)  # evicts a: parked, its worker frozen
            assert worker_a.state == "T"
            agent = f.cluster.agents["n1"].service
            agent.kill(signal.SIGKILL)
            driver_a.kill()
            worker_a.kill()
            # Its lease lapses; the scheduler's Release finds no agent and is not sent again.
            await f.eventually(lambda: _left_group(f, "a"), timeout=LEASE + 5)
            await agent.restart()
            # Back, the agent reads a's parked entry (no process of it lives) and registers;
            # the scheduler's answer does not list a: the entry and its copy are dropped.
            await f.eventually(lambda: _gone_from_agent(f, "a"))
            await f.eventually(lambda: f.cluster.sim_bytes()["parked"] == 0)
            await f.check()
            await b.yield_()


async def test_a_killed_waiter_leaves_the_queue_at_once(faults: Callable[..., Any]) -> None:
    async with faults() as f:
        await f.put_group(name="g")
        async with AsyncClient(job="a", group="g", scheduler=f.address) as a:
            await a.acquire(timeout=10)
            driver_b = await f.driver("b", lease=30.0)
            assert driver_b.process.stdin is not None
            driver_b.process.stdin.write(b'{"op": "acquire", "timeout": 60}\n')
            await driver_b.process.stdin.drain()
            await f.eventually(lambda: _queued(f, "b"))
            killed = time.monotonic()
            driver_b.kill()
            await f.eventually(lambda: _not_queued(f, "b"), timeout=5)
            assert time.monotonic() - killed < 5.0  # not the 30 s lease
            answer = await a.yield_()
            assert answer.waiters == 0
            status = await f.group()
            assert status.holder == ""
            await f.check()


async def _queued(f: Faults, job: str) -> bool:
    return job in (await f.group()).queue


async def _not_queued(f: Faults, job: str) -> bool:
    return job not in (await f.group()).queue


async def _left_group(f: Faults, job: str) -> bool:
    return job not in {j.job for j in (await f.group()).jobs}


async def _gone_from_agent(f: Faults, job: str) -> bool:
    return await f.agent_job("n1", job) is None


async def test_a_job_that_ends_while_parked_is_resumed_so_it_can_exit(
    faults: Callable[..., Any],
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        worker_a = await f.worker("n1", "a")
        async with AsyncClient(job="b", group="g", scheduler=f.address, device_bytes=STATE) as b:
            a = AsyncClient(job="a", group="g", scheduler=f.address, device_bytes=STATE)
            await a.acquire(timeout=30)
            await worker_a.call(op="init", size=STATE, seed=1)
            await a.yield_()
            await b.acquire(timeout=30)
            assert worker_a.state == "T"
            # The job is over while parked (its process is about to exit): it leaves at once,
            # Unregister, released with force.
            await a.close(bring_home=False)
            await f.eventually(lambda: worker_a.state not in ("T", ""))
            assert (await worker_a.call(op="quit"))["ok"]  # it runs, so it can exit
            await worker_a.reap()
            await f.eventually(lambda: f.cluster.sim_bytes()["parked"] == 0)
            await f.eventually(lambda: _gone_from_agent(f, "a"))
            await f.check()
            await b.yield_()


async def test_a_job_that_leaves_resident_keeps_its_device_memory_until_its_processes_exit(
    faults: Callable[..., Any],
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        worker_a = await f.worker("n1", "a")
        worker_b = await f.worker("n1", "b")
        async with AsyncClient(job="b", group="g", scheduler=f.address, device_bytes=STATE) as b:
            await b.acquire(timeout=30)
            await worker_b.call(op="init", size=STATE, seed=2)
            await b.yield_()
            async with AsyncClient(
                job="a", group="g", scheduler=f.address, device_bytes=STATE
            ) as a:
                await a.acquire(timeout=30)  # parks b: both do not fit
                await worker_a.call(op="init", size=STATE, seed=1)
                assert (await a.yield_()).waiters == 0  # nobody waits: a stays resident
            # a left while its state was on the device, and its process lives: that memory
            # is its own until it exits (as on a GPU), so b's restore cannot fit, and says so.
            with pytest.raises(FailedPreconditionError, match="out of memory"):
                await b.acquire(timeout=30)
            assert worker_b.state == "T"  # still parked, state kept
            assert (await worker_a.call(op="quit"))["ok"]
            await worker_a.reap()
            await f.eventually(lambda: _gone_from_agent(f, "a"))
            grant = await b.acquire(timeout=30)  # a's memory was freed at its exit
            assert grant.restored
            assert worker_b.state not in ("T", "")
            await f.check()
            await b.yield_()


async def test_a_job_that_closes_while_parked_gets_its_state_home_first(
    faults: Callable[..., Any],
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        worker_a = await f.worker("n1", "a")
        async with AsyncClient(job="b", group="g", scheduler=f.address, device_bytes=STATE) as b:
            a = AsyncClient(job="a", group="g", scheduler=f.address, device_bytes=STATE)
            await a.acquire(timeout=30)
            before = (await worker_a.call(op="init", size=STATE, seed=1))["hash"]
            await a.yield_()
            await b.acquire(timeout=30)
            assert worker_a.state == "T"
            closing = asyncio.ensure_future(a.close(bring_home=True, timeout=30))
            await f.eventually(lambda: _queued(f, "a"))  # its turn comes after b's
            assert not closing.done()
            await b.yield_()
            await closing
            assert worker_a.state not in ("T", "")
            assert await worker_a.hash() == before  # home, bit for bit, after close()
            status = await f.group()
            assert "a" not in {j.job for j in status.jobs}
            assert (await worker_a.call(op="quit"))["ok"]
            await worker_a.reap()
            await f.eventually(lambda: _gone_from_agent(f, "a"))
