"""An acquire cancelled or timed out while its grant is decided gives the grant back.

A real scheduler on loopback. Job a holds, b waits, c waits behind b; a yields, so the
scheduler grants b, and b's caller leaves at some point of that grant's round trip: some
loop turns after the yield (still queued, decided on the scheduler, answer in flight,
answer in the channel), or as its timeout passes. Whichever: when b's acquire raises, the
scheduler has b neither holding nor waiting, c is granted, and b's next acquire works.
When the cancel comes too late (b's acquire returned first), b holds as it was told; a
cancelled acquire of a job that holds the group already leaves that hold alone.
"""

from __future__ import annotations

import asyncio

import pytest

from rlslice._errors import AlreadyExistsError, DeadlineExceededError
from rlslice.client import AsyncClient, Grant
from rlslice.testing import TestScheduler

from .conftest import eventually

TIMEOUT = 0.2


async def _settled(
    sched: TestScheduler,
    b: AsyncClient,
    c: AsyncClient,
    b_acquire: asyncio.Task[Grant],
    c_acquire: asyncio.Task[Grant],
    left: type[BaseException],
) -> None:
    """Whatever b's acquire ended in, the group is settled: c holds in the end, b's next
    acquire is granted."""
    try:
        await b_acquire
    except left:
        status = await sched.group("gpus")
        assert status.holder != "b", f"b holds a grant its caller never read:\n{status}"
        assert "b" not in status.queue
    else:  # the grant came first: b was told, and yields it
        await b.yield_()
    assert (await asyncio.wait_for(c_acquire, 5)).job == "c"
    assert (await sched.group("gpus")).holder == "c"
    await c.yield_()
    assert (await b.acquire(timeout=5)).job == "b"
    assert (await sched.group("gpus")).holder == "b"


class TestAnAcquireThatLeavesAsItsGrantLandsGivesItBack:
    @pytest.mark.parametrize("turns", range(40))
    async def test_a_cancel_some_loop_turns_after_the_competing_yield_gives_the_group_on(
        self, sched: TestScheduler, turns: int
    ) -> None:
        async with (
            AsyncClient(job="a", group="gpus", scheduler=sched.address) as a,
            AsyncClient(job="b", group="gpus", scheduler=sched.address) as b,
            AsyncClient(job="c", group="gpus", scheduler=sched.address) as c,
        ):
            await a.acquire()
            b_acquire = asyncio.create_task(b.acquire())
            await eventually(sched, "gpus", lambda s: list(s.queue) == ["b"])
            c_acquire = asyncio.create_task(c.acquire())
            await eventually(sched, "gpus", lambda s: list(s.queue) == ["b", "c"])
            competing_yield = asyncio.create_task(a.yield_())
            for _ in range(turns):
                await asyncio.sleep(0)
            b_acquire.cancel()
            await _settled(sched, b, c, b_acquire, c_acquire, asyncio.CancelledError)
            await competing_yield

    @pytest.mark.parametrize("offset_ms", range(-24, 12))
    async def test_a_timeout_that_passes_as_the_grant_lands_gives_the_group_on(
        self, sched: TestScheduler, offset_ms: int
    ) -> None:
        async with (
            AsyncClient(job="a", group="gpus", scheduler=sched.address) as a,
            AsyncClient(job="b", group="gpus", scheduler=sched.address) as b,
            AsyncClient(job="c", group="gpus", scheduler=sched.address) as c,
        ):
            await b.acquire(timeout=5)  # registered: the timeout below counts the wait only
            await b.yield_()
            await a.acquire(timeout=5)
            loop = asyncio.get_running_loop()
            b_acquire = asyncio.create_task(b.acquire(timeout=TIMEOUT))
            deadline = loop.time() + TIMEOUT
            await eventually(sched, "gpus", lambda s: list(s.queue) == ["b"])
            c_acquire = asyncio.create_task(c.acquire())
            await eventually(sched, "gpus", lambda s: list(s.queue) == ["b", "c"])
            yielded: asyncio.Future[None] = loop.create_future()

            def competing_yield() -> None:
                task = asyncio.ensure_future(a.yield_())
                task.add_done_callback(lambda _: yielded.set_result(None))

            loop.call_at(deadline + offset_ms / 4000, competing_yield)
            await _settled(sched, b, c, b_acquire, c_acquire, DeadlineExceededError)
            await yielded

    @pytest.mark.parametrize("turns", range(8))
    async def test_a_cancelled_acquire_of_a_job_that_holds_the_group_leaves_the_hold(
        self, sched: TestScheduler, turns: int
    ) -> None:
        async with AsyncClient(job="b", group="gpus", scheduler=sched.address) as b:
            async with b.phase("train") as grant:
                again = asyncio.create_task(b.acquire())
                for _ in range(turns):
                    await asyncio.sleep(0)
                again.cancel()
                with pytest.raises((asyncio.CancelledError, AlreadyExistsError)):
                    await again
                status = await sched.group("gpus")
                assert (status.holder, status.epoch) == ("b", grant.epoch)
            assert (await sched.group("gpus")).holder == ""
