"""Restarts of the scheduler and of an agent lose nothing.

Real `rlslice scheduler` (SQLite store) and `rlslice agent` processes, SIGKILLed (no
cleanup of any kind) and started again on the same files and ports; real job workers with
seeded device memory compared by sha256 before and after.

Cases:
- the scheduler is killed in the middle of a switch (the outgoing job snapshotted, the
  incoming one not restored yet: a slow copy rate makes the window wide) and restarted:
  the switch completes; holder, queue order, parked set and epochs are intact; both jobs'
  bytes are intact when each runs again;
- an agent is killed while one job is parked and another runs, and restarted: it re-reads
  both jobs' states from the backend (same states, same pids), and the next switches work
  with the bytes intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from rlslice.client import AsyncClient
from rlslice.v1alpha1 import agent_pb2 as apb

if TYPE_CHECKING:
    from conftest import Faults, Proc

MiB = 1 << 20
STATE = 8 * MiB


async def _first_hold(f: Faults, client: AsyncClient, worker: Proc, seed: int) -> str:
    """`client` takes the group, its worker fills its memory; returns the bytes' hash."""
    await client.acquire(timeout=30)
    answer = await worker.call(op="init", size=STATE, seed=seed)
    assert answer["ok"], answer
    await client.yield_()
    return str(answer["hash"])


async def test_a_scheduler_killed_mid_switch_resumes_it_with_nothing_lost(
    faults: Callable[..., Any],
) -> None:
    # 8 MiB at 0.04 GB/s: each move takes about 0.2 s.
    async with faults(capacity_bytes=12 * MiB, rate_gbps=0.04) as f:
        await f.put_group(name="g")
        worker_a, worker_b = await f.worker("n1", "a"), await f.worker("n1", "b")
        async with contextlib.AsyncExitStack() as stack:

            async def client(job: str) -> AsyncClient:
                # c and d hold no device memory (1 byte: they fit beside anyone).
                size = STATE if job in "ab" else 1
                made = AsyncClient(job=job, group="g", scheduler=f.address, device_bytes=size)
                return await stack.enter_async_context(made)

            a, b, c, d = [await client(job) for job in "abcd"]
            hash_a = await _first_hold(f, a, worker_a, seed=1)
            hash_b = await _first_hold(f, b, worker_b, seed=2)  # a is parked now
            assert list((await f.group()).parked) == ["a"]
            # c holds; d waits behind a: the queue the restart must keep.
            await c.acquire(timeout=30)
            waiting_a = asyncio.ensure_future(a.acquire(timeout=60))
            await f.eventually(lambda: _queue_is(f, ["a"]))
            waiting_d = asyncio.ensure_future(d.acquire(timeout=60))
            await f.eventually(lambda: _queue_is(f, ["a", "d"]))
            await f.check(live={"a": [worker_a], "b": [worker_b]})
            before = await f.group()

            # The switch to a: snapshot b, then restore a; at c's yield, or before it as a
            # prefetch beside c (a is the head waiter and fits once b is parked).
            await c.yield_()
            await f.eventually(lambda: _parked_on_agent(f, "b"), timeout=10)
            f.cluster.scheduler.kill(signal.SIGKILL)
            agent_a = await f.agent_job("n1", "a")
            assert agent_a is not None
            moved = (apb.AGENT_JOB_STATE_PARKED, apb.AGENT_JOB_STATE_RESTORING)
            assert agent_a.state in (*moved, apb.AGENT_JOB_STATE_RUNNING)
            await f.cluster.scheduler.restart()

            grant = await asyncio.wait_for(waiting_a, 30)  # the client re-issued it
            assert grant.epoch > before.epoch
            after = await f.group()
            assert after.holder == "a"
            assert list(after.queue) == ["d"]
            assert list(after.parked) == ["b"]
            assert after.epoch >= before.epoch
            await f.check(live={"a": [worker_a], "b": [worker_b]})
            assert await worker_a.hash() == hash_a
            assert worker_b.state == "T"

            await a.yield_()  # d holds next (nothing to move), then b comes back
            await asyncio.wait_for(waiting_d, 30)
            await d.yield_()
            await b.acquire(timeout=30)
            assert await worker_b.hash() == hash_b
            await f.check(live={"a": [worker_a], "b": [worker_b]})
            await b.yield_()


async def test_a_restarted_agent_rereads_job_states_and_the_next_switch_works(
    faults: Callable[..., Any],
) -> None:
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        worker_a, worker_b = await f.worker("n1", "a"), await f.worker("n1", "b")
        async with (
            AsyncClient(job="a", group="g", scheduler=f.address, device_bytes=STATE) as a,
            AsyncClient(job="b", group="g", scheduler=f.address, device_bytes=STATE) as b,
        ):
            hash_a = await _first_hold(f, a, worker_a, seed=1)
            await b.acquire(timeout=30)  # a parked, b runs
            hash_b = (await worker_b.call(op="init", size=STATE, seed=2))["hash"]
            seen = {e.job: (e.state, list(e.pids)) for e in (await f.agent_status("n1")).jobs}

            agent = f.cluster.agents["n1"].service
            agent.kill(signal.SIGKILL)
            await agent.restart()
            reread = {e.job: (e.state, list(e.pids)) for e in (await f.agent_status("n1")).jobs}
            assert reread == seen
            assert reread["a"][0] == apb.AGENT_JOB_STATE_PARKED
            assert reread["b"][0] == apb.AGENT_JOB_STATE_RUNNING
            assert worker_a.state == "T"
            await f.check(live={"a": [worker_a], "b": [worker_b]})

            await b.yield_()
            grant = await a.acquire(timeout=30)  # b out, a back in: through the new agent
            assert grant.restored
            assert await worker_a.hash() == hash_a
            await a.yield_()
            await b.acquire(timeout=30)
            assert await worker_b.hash() == hash_b
            await f.check(live={"a": [worker_a], "b": [worker_b]})
            await b.yield_()


async def _queue_is(f: Faults, jobs: list[str]) -> bool:
    return list((await f.group()).queue) == jobs


async def _parked_on_agent(f: Faults, job: str) -> bool:
    entry = await f.agent_job("n1", job)
    return entry is not None and entry.state == apb.AGENT_JOB_STATE_PARKED


async def test_a_starting_scheduler_answers_unavailable_until_its_state_is_loaded() -> None:
    """The port opens before the store is loaded (health says NOT_SERVING meanwhile); a call
    in that window was answered from an empty state (a lease "unknown", a group created
    twice) and, in the soak, ended with two jobs believing they held one group."""
    import grpc

    from rlslice.adapters.channel import open_channel
    from rlslice.testing import scheduler_for_tests
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    async with scheduler_for_tests(groups=["g"]) as sched:
        engine = sched.running.engine
        engine.ready = False  # as between binding the port and loading the store
        before = {n: r.state for n, r in engine.groups.items()}
        async with open_channel(sched.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for call in (
                stub.Register(pb.RegisterRequest(job="a", group="g")),
                stub.GetGroup(pb.GetGroupRequest(group="g")),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "starting" in (caught.value.details() or "")
            assert {n: r.state for n, r in engine.groups.items()} == before
            engine.ready = True
            assert (await stub.Register(pb.RegisterRequest(job="a", group="g"))).lease_id


async def test_a_job_that_ends_while_the_scheduler_restarts_is_resumed_not_left_frozen(
    faults: Callable[..., Any],
) -> None:
    # The soak's open case: a driver closes its client while the scheduler is down. Its
    # Unregister must outlast the restart (the restarted scheduler keeps the lease for a ttl),
    # or the lease lapses, is released without force, and the parked worker stays frozen.
    async with faults(capacity_bytes=12 * MiB) as f:
        await f.put_group(name="g")
        worker_a = await f.worker("n1", "a")
        async with AsyncClient(job="b", group="g", scheduler=f.address, device_bytes=STATE) as b:
            # A closing client tries for its lease's ttl (20 s): the kill, 6.5 s down and a
            # restart (several seconds on a loaded machine) must fit in it.
            a = AsyncClient(
                job="a", group="g", scheduler=f.address, device_bytes=STATE, lease_seconds=20
            )
            await _first_hold(f, a, worker_a, seed=1)
            await b.acquire(timeout=30)
            assert worker_a.state == "T"  # parked
            f.cluster.scheduler.kill(signal.SIGKILL)
            closing = asyncio.ensure_future(a.close())
            await asyncio.sleep(6.5)  # longer than a closing client used to try
            assert not closing.done()
            await f.cluster.scheduler.restart()
            await asyncio.wait_for(closing, 30)
            await f.eventually(lambda: worker_a.state not in ("T", ""), timeout=15)
            assert (await worker_a.call(op="quit"))["ok"]  # it runs, so it can exit
            await worker_a.reap()
            await f.eventually(lambda: f.cluster.sim_bytes()["parked"] == 0)
            await b.yield_()
