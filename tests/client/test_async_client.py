"""AsyncClient against a real scheduler on loopback.

Cases:
- a phase holds the group for its block (async with, and as a decorator), then yields;
- nested and concurrent phases of one client share one hold and yield once;
- two clients contend: B blocks until A yields, then B holds with a higher epoch;
- an acquire that times out, or whose task is cancelled, leaves no waiter behind;
- close() releases the lock a client holds (a waiter is granted) and leaves the queue;
- close() ends the client's own waiting acquire (FailedPreconditionError), registering nothing;
- the keep-alive keeps a lease alive past its lease time;
- yield by a non-holder is refused (FailedPreconditionError), changing nothing;
- one client uses several groups at once;
- configuration from environment variables alone;
- the scheduler's request to yield reaches yield_requested() and the callback;
- the device bytes a job announces reach the scheduler.
"""

from __future__ import annotations

import asyncio

import pytest

from rlslice._errors import DeadlineExceededError, FailedPreconditionError
from rlslice.client import AsyncClient, Grant
from rlslice.config import GroupSpec
from rlslice.testing import TestScheduler, scheduler_for_tests

from .conftest import eventually


async def test_the_device_bytes_a_job_announces_reach_the_scheduler(
    sched: TestScheduler,
) -> None:
    async with AsyncClient(
        job="a", group="gpus", scheduler=sched.address, device_bytes=3 << 20
    ) as client:
        await client.acquire()
        status = await sched.group("gpus")
        assert [(j.job, j.device_bytes) for j in status.jobs] == [("a", 3 << 20)]


async def test_a_phase_holds_the_group_for_its_block(sched: TestScheduler) -> None:
    async with AsyncClient(job="a", group="gpus", scheduler=sched.address) as client:
        async with client.phase("train") as grant:
            assert isinstance(grant, Grant)
            assert (grant.job, grant.group, grant.disabled) == ("a", "gpus", False)
            assert grant.epoch >= 1
            assert (await sched.group("gpus")).holder == "a"
        assert (await sched.group("gpus")).holder == ""


async def test_a_decorated_coroutine_runs_while_holding(sched: TestScheduler) -> None:
    async with AsyncClient(job="a", group="gpus", scheduler=sched.address) as client:

        @client.phase("rollout")
        async def rollout(n: int) -> str:
            return f"{(await sched.group('gpus')).holder}:{n}"

        assert await rollout(1) == "a:1"
        assert await rollout(2) == "a:2"
        assert rollout.__name__ == "rollout"
        assert (await sched.group("gpus")).holder == ""


async def test_nested_and_concurrent_phases_share_one_hold(sched: TestScheduler) -> None:
    async with AsyncClient(job="a", group="gpus", scheduler=sched.address) as client:
        async with client.phase("outer") as outer:
            async with client.phase("inner") as inner:
                assert inner == outer  # no second acquire: the same grant
            assert (await sched.group("gpus")).holder == "a"  # the inner exit did not yield

            async def task() -> int:
                async with client.phase("side") as grant:
                    return grant.epoch

            assert await asyncio.gather(task(), task()) == [outer.epoch, outer.epoch]
        assert (await sched.group("gpus")).holder == ""


async def test_b_blocks_until_a_yields(sched: TestScheduler) -> None:
    a = AsyncClient(job="a", group="gpus", scheduler=sched.address)
    b = AsyncClient(job="b", group="gpus", scheduler=sched.address)
    first = await a.acquire()
    waiting = asyncio.create_task(b.acquire())
    await eventually(sched, "gpus", lambda s: list(s.queue) == ["b"])
    assert not waiting.done()
    result = await a.yield_()
    assert result.waiters == 1
    assert not result.snapshot_deferred
    second = await asyncio.wait_for(waiting, 5)
    assert second.job == "b"
    assert second.epoch > first.epoch
    assert second.waited_seconds > 0
    assert (await sched.group("gpus")).holder == "b"
    await a.close()
    await b.close()


async def test_a_yield_without_waiters_defers_the_snapshot(sched: TestScheduler) -> None:
    async with AsyncClient(job="a", group="gpus", scheduler=sched.address) as client:
        await client.acquire()
        result = await client.yield_()
        assert (result.waiters, result.snapshot_deferred) == (0, True)


async def test_an_acquire_that_times_out_leaves_no_waiter(sched: TestScheduler) -> None:
    async with (
        AsyncClient(job="a", group="gpus", scheduler=sched.address) as a,
        AsyncClient(job="b", group="gpus", scheduler=sched.address) as b,
    ):
        await a.acquire()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(DeadlineExceededError, match=r"^timeout: group 'gpus'"):
            await b.acquire(timeout=0.3)
        assert 0.25 < loop.time() - started < 3
        status = await eventually(sched, "gpus", lambda s: len(s.queue) == 0)
        assert status.holder == "a"
        await a.yield_()
        assert (await sched.group("gpus")).holder == ""  # nobody was granted behind a's back


async def test_a_cancelled_acquire_leaves_no_waiter(sched: TestScheduler) -> None:
    async with (
        AsyncClient(job="a", group="gpus", scheduler=sched.address) as a,
        AsyncClient(job="b", group="gpus", scheduler=sched.address) as b,
    ):
        await a.acquire()
        waiting = asyncio.create_task(b.acquire())
        await eventually(sched, "gpus", lambda s: list(s.queue) == ["b"])
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await eventually(sched, "gpus", lambda s: len(s.queue) == 0)
        await a.yield_()
        assert (await sched.group("gpus")).holder == ""
        # b may try again afterwards: its lease is intact.
        assert (await b.acquire(timeout=5)).job == "b"


async def test_closing_a_client_releases_its_lock_to_the_waiter(sched: TestScheduler) -> None:
    a = AsyncClient(job="a", group="gpus", scheduler=sched.address)
    async with AsyncClient(job="b", group="gpus", scheduler=sched.address) as b:
        await a.acquire()
        waiting = asyncio.create_task(b.acquire())
        await eventually(sched, "gpus", lambda s: list(s.queue) == ["b"])
        await a.close()
        assert (await asyncio.wait_for(waiting, 5)).job == "b"
        status = await sched.group("gpus")
        assert [j.job for j in status.jobs] == ["b"]  # a's lease is gone too


async def test_closing_a_client_ends_its_waiting_acquire(sched: TestScheduler) -> None:
    async with AsyncClient(job="a", group="gpus", scheduler=sched.address) as a:
        await a.acquire()
        b = AsyncClient(job="b", group="gpus", scheduler=sched.address)
        waiting = asyncio.create_task(b.acquire())
        await eventually(sched, "gpus", lambda s: list(s.queue) == ["b"])
        await b.close()
        with pytest.raises(FailedPreconditionError, match=r"^client: closed"):
            await asyncio.wait_for(waiting, 5)
        status = await sched.group("gpus")
        assert (status.holder, list(status.queue)) == ("a", [])
        assert [j.job for j in status.jobs] == ["a"]  # b did not register again


async def test_the_keep_alive_holds_a_lease_past_its_lease_time(sched: TestScheduler) -> None:
    async with AsyncClient(
        job="a", group="gpus", scheduler=sched.address, lease_seconds=1
    ) as client:
        async with client.phase("train"):
            await asyncio.sleep(2.5)
            assert (await sched.group("gpus")).holder == "a"
        assert (await sched.group("gpus")).holder == ""


async def test_a_yield_by_a_non_holder_is_refused(sched: TestScheduler) -> None:
    async with (
        AsyncClient(job="a", group="gpus", scheduler=sched.address) as a,
        AsyncClient(job="b", group="gpus", scheduler=sched.address) as b,
    ):
        with pytest.raises(FailedPreconditionError, match=r"^group: job 'b' does not hold"):
            await b.yield_()  # never acquired: refused without a call
        await b.acquire()
        await b.yield_()
        grant = await a.acquire()
        with pytest.raises(FailedPreconditionError, match=r"'b'"):
            await b.yield_()
        status = await sched.group("gpus")
        assert (status.holder, status.epoch) == ("a", grant.epoch)  # unchanged


async def test_one_client_holds_several_groups(sched: TestScheduler) -> None:
    async with AsyncClient(job="a", group="gpus", scheduler=sched.address) as client:
        async with client.phase("rollout", group="rollout-pool"), client.phase("train"):
            assert (await sched.group("gpus")).holder == "a"
            assert (await sched.group("rollout-pool")).holder == "a"
        assert (await sched.group("rollout-pool")).holder == ""


async def test_a_client_configured_by_environment_alone(
    sched: TestScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSLICE_SCHEDULER", sched.address)
    monkeypatch.setenv("RLSLICE_JOB", "env-job")
    monkeypatch.setenv("RLSLICE_GROUP", "gpus")
    async with AsyncClient() as client:
        assert not client.disabled
        async with client.phase("train") as grant:
            assert grant.job == "env-job"
            assert (await sched.group("gpus")).holder == "env-job"


async def test_the_request_to_yield_reaches_the_job() -> None:
    spec = GroupSpec(name="gpus", max_hold_seconds=0.5, yield_grace_seconds=30)
    async with scheduler_for_tests(groups=[spec]) as sched:
        asked: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

        async def on_yield_requested(group: str, preempt_in: float) -> None:
            await asked.put((group, preempt_in))

        async with (
            AsyncClient(
                job="a",
                group="gpus",
                scheduler=sched.address,
                lease_seconds=1,
                on_yield_requested=on_yield_requested,
            ) as a,
            AsyncClient(job="b", group="gpus", scheduler=sched.address) as b,
        ):
            await a.acquire()
            assert not a.yield_requested()
            waiting = asyncio.create_task(b.acquire())
            group, preempt_in = await asyncio.wait_for(asked.get(), 5)
            assert group == "gpus"
            assert 0 < preempt_in <= 30
            assert a.yield_requested("gpus")
            await a.yield_()
            assert (await asyncio.wait_for(waiting, 5)).job == "b"
