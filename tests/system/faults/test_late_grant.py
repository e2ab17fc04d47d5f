"""A grant whose answer reaches the waiter only after its lease lapsed is not handed out.

The waiter dials the scheduler through a `delayproxy.DelayProxy` (a TCP proxy under the
test's control). While it waits, the link is cut (nothing crosses either way); the holder
yields, and the scheduler grants the waiter, but the answer is held in the proxy. The
waiter's lease lapses (no keep-alive gets through), so the scheduler takes the group back
from it. After the heal the held answer arrives: the client sees that its lease may have
lapsed meanwhile (no renewal answered for a ttl), asks the scheduler (a KeepAlive, refused:
the lease is gone), registers again and acquires anew. The acquire returns that new grant,
with a higher epoch, under which the job really holds the group, not the void one (the soak
found a driver that took the void grant and ran beside the next holder).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rlslice.client import AsyncClient
from rlslice.testing import TestScheduler, scheduler_for_tests
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .delayproxy import DelayProxy
from .netfault import private_host

LEASE = 1.0


async def test_a_grant_answered_after_the_lease_lapsed_is_replaced_by_a_fresh_one() -> None:
    async with scheduler_for_tests(groups=["g"]) as sched:
        host, port = sched.address.rsplit(":", 1)
        with DelayProxy(private_host(1), (host, int(port)), 0.0) as link:
            async with (
                AsyncClient(job="a", group="g", scheduler=sched.address, lease_seconds=30) as a,
                AsyncClient(job="b", group="g", scheduler=link.address, lease_seconds=LEASE) as b,
            ):
                await a.acquire()
                waiting = asyncio.ensure_future(b.acquire(timeout=60))
                await _until(sched, lambda s: list(s.queue) == ["b"])
                link.cut()
                await a.yield_()
                granted = await _until(sched, lambda s: s.holder == "b")
                # No keep-alive of b's gets through: the scheduler lapses its lease.
                await _until(sched, lambda s: "b" not in {j.job for j in s.jobs}, timeout=10)
                assert not waiting.done()
                link.heal()
                grant = await waiting
                assert grant.epoch > granted.epoch
                status = await sched.group("g")
                assert status.holder == "b"
                assert status.epoch == grant.epoch
                await b.yield_()


async def _until(
    sched: TestScheduler, check: Callable[[pb.GroupStatus], bool], timeout: float = 5.0
) -> pb.GroupStatus:
    """Group "g"'s status once `check` holds (polled on the loop's clock)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while not check(status := await sched.group("g")):
        assert loop.time() < give_up, status
        await asyncio.sleep(0.02)
    return status
