"""Waiters that give up leave no ghost behind.

A real scheduler on loopback (in-process: nothing is killed here; a killed waiter process
is in test_dead_jobs.py). After each case the group's queue is empty, the holder's yield
reports no waiter and grants nobody, and the job that gave up can acquire again at once
(a ghost would make that ALREADY_EXISTS).

Cases (parametrized): the acquire's timeout passes; the task awaiting the acquire is
cancelled; a blocking `Client.acquire` with a timeout, from a thread.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rlslice import DeadlineExceededError
from rlslice.client import AsyncClient, Client
from rlslice.testing import TestScheduler, scheduler_for_tests


async def _give_up_by_timeout(client: AsyncClient) -> None:
    with pytest.raises(DeadlineExceededError, match="timeout"):
        await client.acquire(timeout=0.3)


async def _give_up_by_cancel(client: AsyncClient) -> None:
    task = asyncio.ensure_future(client.acquire())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _give_up_from_a_thread(client: AsyncClient) -> Client:
    """The same job through the blocking facade (closed by the test, after its checks)."""
    sync = Client(job="c", group="g", scheduler=client.scheduler)

    def blocking() -> None:
        with pytest.raises(DeadlineExceededError):
            sync.acquire(timeout=0.3)

    await asyncio.to_thread(blocking)
    return sync


@pytest.mark.parametrize(
    "give_up", [_give_up_by_timeout, _give_up_by_cancel, _give_up_from_a_thread]
)
async def test_a_waiter_that_gives_up_is_no_longer_queued(give_up: object) -> None:
    async with (
        scheduler_for_tests(groups=["g"]) as sched,
        AsyncClient(job="a", group="g", scheduler=sched.address) as a,
        AsyncClient(job="b", group="g", scheduler=sched.address) as b,
    ):
        first = await a.acquire(timeout=5)
        leftover = await give_up(b)  # type: ignore[operator]
        await _queue_empties(sched)
        answer = await a.yield_()
        assert (answer.waiters, answer.snapshot_deferred) == (0, True)
        status = await sched.group("g")
        assert status.holder == ""
        assert status.epoch == first.epoch  # nobody was granted since
        again = await b.acquire(timeout=5)  # not ALREADY_EXISTS: no ghost of b
        assert again.epoch > first.epoch
        await b.yield_()
        if leftover is not None:
            await asyncio.to_thread(leftover.close)


async def _queue_empties(sched: TestScheduler) -> None:
    # The server hears of the cancellation a moment after the client: within a second.
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 1.0
    while (await sched.group("g")).queue:
        assert loop.time() < give_up, "a ghost waiter stayed in the queue"
        await asyncio.sleep(0.02)


async def test_many_waiters_timing_out_together_leave_nothing_behind() -> None:
    async with scheduler_for_tests(groups=["g"]) as sched, contextlib.AsyncExitStack() as stack:
        holder = await stack.enter_async_context(
            AsyncClient(job="holder", group="g", scheduler=sched.address)
        )
        await holder.acquire(timeout=5)
        waiters = [
            await stack.enter_async_context(
                AsyncClient(job=f"w{i}", group="g", scheduler=sched.address)
            )
            for i in range(8)
        ]
        results = await asyncio.gather(
            *(w.acquire(timeout=0.2 + 0.05 * i) for i, w in enumerate(waiters)),
            return_exceptions=True,
        )
        assert all(isinstance(r, DeadlineExceededError) for r in results)
        await _queue_empties(sched)
        assert (await holder.yield_()).waiters == 0
        assert (await sched.group("g")).holder == ""


async def test_a_grant_whose_answer_was_lost_but_then_confirmed_is_not_given_back() -> None:
    """A client that lost an Acquire's answer re-issues it, is told ALREADY_EXISTS and reads
    that it holds; the server, seeing the first call cancelled afterwards, must not yield
    for it (the soak found both happening: two jobs believed they held the group)."""
    import grpc

    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    async with scheduler_for_tests(groups=["g"]) as sched:
        engine = sched.running.engine
        async with open_channel(sched.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            lease = await stub.Register(pb.RegisterRequest(job="a", group="g"))
            request = pb.AcquireRequest(
                job="a", group="g", lease_id=lease.lease_id, secret=lease.secret
            )
            grant = await stub.Acquire(request)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Acquire(request)  # the re-issued call
            assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
            engine.lost_grant("g", "a", grant.epoch)  # the first call's late "cancelled"
            assert (await sched.group("g")).holder == "a"
