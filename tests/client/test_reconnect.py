"""The client survives a scheduler restart on the same port.

Cases:
- SQLite store: a waiter's acquire, interrupted by the restart, is issued again and keeps
  its place; the holder's yield after the restart hands the group over;
- in-memory store: the restarted scheduler forgot every lease; the next acquire registers
  again and is granted, and the keep-alive registers a lease again by itself;
- a phase whose lease was lost during the block does not yield someone else's grant: it
  raises LockLostError at its exit; so does one that ends before its client noticed the
  loss (the scheduler answers its Yield NOT_FOUND: the lock is gone already);
- a holder whose lease the keep-alive registered again is queued by its client to bring
  its state home, and holds the group again once granted; a bare yield then raises
  LockLostError and gives that hold back;
- an acquire made while no scheduler listens yet is granted once one comes up.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rlslice import LockLostError
from rlslice.client import AsyncClient
from rlslice.testing import TestScheduler, free_port, scheduler_for_tests

from .conftest import eventually


async def test_a_waiter_survives_a_restart_with_a_sqlite_store(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    store = {"store": str(tmp_path / "state.db")}
    async with scheduler_for_tests(groups=["gpus"], address=address, **store) as first:
        a = AsyncClient(job="a", group="gpus", scheduler=address, lease_seconds=30)
        b = AsyncClient(job="b", group="gpus", scheduler=address, lease_seconds=30)
        held = await a.acquire()
        waiting = asyncio.create_task(b.acquire())
        await eventually(first, "gpus", lambda s: list(s.queue) == ["b"])
    assert not waiting.done()  # the scheduler is gone; b keeps trying
    async with scheduler_for_tests(address=address, **store) as second:
        status = await eventually(second, "gpus", lambda s: list(s.queue) == ["b"])
        assert status.holder == "a"
        await a.yield_()
        granted = await asyncio.wait_for(waiting, 10)
        assert granted.job == "b"
        assert granted.epoch > held.epoch
        await a.close()
        await b.close()


async def test_after_a_restart_with_a_memory_store_the_job_registers_again() -> None:
    address = f"127.0.0.1:{free_port()}"
    async with scheduler_for_tests(groups=["gpus"], address=address):
        client = AsyncClient(job="a", group="gpus", scheduler=address, lease_seconds=30)
        await client.acquire()
        await client.yield_()
    async with scheduler_for_tests(address=address) as second:
        grant = await client.acquire(timeout=10)
        assert grant.job == "a"
        assert (await second.group("gpus")).holder == "a"
        await client.yield_()
        await client.close()


async def test_the_keep_alive_registers_a_forgotten_lease_again() -> None:
    address = f"127.0.0.1:{free_port()}"
    async with scheduler_for_tests(groups=["gpus"], address=address):
        client = AsyncClient(job="a", group="gpus", scheduler=address, lease_seconds=1)
        await client.acquire()
        await client.yield_()
    async with scheduler_for_tests(groups=["gpus"], address=address) as second:
        status = await eventually(second, "gpus", lambda s: [j.job for j in s.jobs] == ["a"])
        assert status.holder == ""
        await client.close()


async def test_a_phase_that_lost_its_lease_does_not_yield_and_raises_lock_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    address = f"127.0.0.1:{free_port()}"
    async with scheduler_for_tests(groups=["gpus"], address=address):
        client = AsyncClient(job="a", group="gpus", scheduler=address, lease_seconds=1)
        phase = client.phase("train")
        await phase.__aenter__()
    second: TestScheduler
    async with scheduler_for_tests(groups=["gpus"], address=address) as second:
        async with AsyncClient(job="b", group="gpus", scheduler=address) as other:
            # The new scheduler never knew a held: b's acquire and a's homecoming (queued by
            # its keep-alive) race; whichever is granted first, the other waits.
            granted = asyncio.ensure_future(other.acquire(timeout=30))
            await eventually(
                second, "gpus", lambda s: len(s.jobs) == 2 and s.holder != "" and len(s.queue) == 1
            )
            with pytest.raises(LockLostError) as lost:
                await phase.__aexit__(None, None, None)
            assert lost.value.group == "gpus"
            assert lost.value.epoch > 0
            assert "lost group 'gpus'" in caplog.text
            await granted
            status = await eventually(second, "gpus", lambda s: list(s.queue) == [])
            assert status.holder == "b"  # a gave back (or left the queue), never took b's
        await client.close()


async def test_a_bare_yield_after_the_homecoming_was_granted_raises_lock_lost_and_gives_it_back() -> (
    None
):
    address = f"127.0.0.1:{free_port()}"
    async with scheduler_for_tests(groups=["gpus"], address=address):
        client = AsyncClient(job="a", group="gpus", scheduler=address, lease_seconds=1)
        held = await client.acquire()
    async with scheduler_for_tests(groups=["gpus"], address=address) as second:
        # Nobody else holds: the homecoming Acquire the keep-alive queued is granted.
        status = await eventually(second, "gpus", lambda s: s.holder == "a")
        assert status.epoch > 0
        with pytest.raises(LockLostError) as lost:
            await client.yield_()
        assert lost.value.epoch == held.epoch
        assert (await second.group("gpus")).holder == ""
        again = await client.acquire(timeout=10)  # the next hold goes as usual
        assert (await second.group("gpus")).holder == "a"
        await client.yield_()
        assert again.epoch > status.epoch
        await client.close()


async def test_a_phase_ending_before_its_client_noticed_the_loss_raises_lock_lost() -> None:
    address = f"127.0.0.1:{free_port()}"
    async with scheduler_for_tests(groups=["gpus"], address=address):
        # A long lease: no keep-alive notices the restart before the phase ends.
        client = AsyncClient(job="a", group="gpus", scheduler=address, lease_seconds=600)
        phase = client.phase("train")
        await phase.__aenter__()
    async with scheduler_for_tests(groups=["gpus"], address=address) as second:
        with pytest.raises(LockLostError, match="lost the lock of group 'gpus'"):
            await phase.__aexit__(None, None, None)  # its Yield: NOT_FOUND, the lock is lost
        assert (await second.group("gpus")).holder == ""
        await client.close()


async def test_an_acquire_made_before_the_scheduler_is_up_is_granted_once_it_is() -> None:
    address = f"127.0.0.1:{free_port()}"
    client = AsyncClient(job="a", group="gpus", scheduler=address)
    waiting = asyncio.create_task(client.acquire(timeout=20))
    await asyncio.sleep(0.5)
    assert not waiting.done()  # nobody listens yet: the client keeps trying
    async with scheduler_for_tests(groups=["gpus"], address=address) as sched:
        grant = await asyncio.wait_for(waiting, 10)
        assert grant.job == "a"
        assert (await sched.group("gpus")).holder == "a"
        await client.close()
