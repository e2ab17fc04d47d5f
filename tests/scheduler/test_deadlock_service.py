"""Deadlock detection over real gRPC on loopback (raw stubs, one lease per job and group).

Cases:
- two jobs, each holding one group and asking for the other's: the Acquire that closes the
  cycle fails with ABORTED and a one-line message naming both jobs and groups; that waiter
  leaves the queue, the holders keep their groups, the other wait goes on and is granted
  once the aborted job yields; the event ring records the failure;
- a three-job ring: the third wait fails, naming all three jobs and groups;
- a chain that ends at a job waiting for nothing: no wait is aborted, all are granted as
  the chain unwinds;
- a new holder closes a cycle (a job with two calls in flight): the waiter that now waits
  on it, and only that one, fails with ABORTED when the grant is made;
- a job that holds nothing never gets ABORTED, however many wait.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc
import pytest

if TYPE_CHECKING:
    from conftest import Live

TWO = (
    'deadlock: job "b" waits for group "g1" held by "a", which waits for group "g2" held by '
    '"b"; acquire both in one call (phase(groups=[...])) or always in the same order'
)


async def _leases(live: Live, jobs: str, groups: tuple[str, ...]) -> dict[tuple[str, str], Any]:
    return {(j, g): await live.register(j, g) for j in jobs for g in groups}


async def test_the_acquire_that_closes_a_two_job_cycle_fails_with_aborted(live: Live) -> None:
    leases = await _leases(live, "ab", ("g1", "g2"))
    await live.acquire("a", leases["a", "g1"], "g1")
    await live.acquire("b", leases["b", "g2"], "g2")
    a_waits = asyncio.ensure_future(live.acquire("a", leases["a", "g2"], "g2"))
    await live.waiting("a", "g2")

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await live.acquire("b", leases["b", "g1"], "g1")

    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert caught.value.details() == TWO
    g1, g2 = await live.group("g1"), await live.group("g2")
    assert (g1.holder, list(g1.queue)) == ("a", [])  # the aborted waiter left at once
    assert (g2.holder, list(g2.queue)) == ("b", ["a"])  # the other wait goes on
    assert not a_waits.done()
    failed = [e for e in live.engine.groups["g1"].ring if e.kind == "failed"]
    assert [(e.job, e.detail) for e in failed] == [("b", TWO)]

    await live.yield_("b", leases["b", "g2"], "g2")
    granted = await asyncio.wait_for(a_waits, 5)
    assert (granted.job, granted.group) == ("a", "g2")


async def test_a_three_job_ring_is_detected(live: Live) -> None:
    groups = ("g1", "g2", "g3")
    leases = await _leases(live, "abc", groups)
    for job, group in zip("abc", groups, strict=True):
        await live.acquire(job, leases[job, group], group)
    waits = []
    for job, group in (("a", "g2"), ("b", "g3")):
        waits.append(asyncio.ensure_future(live.acquire(job, leases[job, group], group)))
        await live.waiting(job, group)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await live.acquire("c", leases["c", "g1"], "g1")

    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert caught.value.details() == (
        'deadlock: job "c" waits for group "g1" held by "a", which waits for group "g2" held '
        'by "b", which waits for group "g3" held by "c"; acquire them in one call '
        "(phase(groups=[...])) or always in the same order"
    )
    assert [(await live.group(g)).holder for g in groups] == ["a", "b", "c"]
    assert not any(w.done() for w in waits)
    for w in waits:
        w.cancel()


async def test_a_chain_without_a_cycle_is_not_aborted(live: Live) -> None:
    groups = ("g1", "g2", "g3")
    leases = await _leases(live, "abc", groups)
    for job, group in zip("abc", groups, strict=True):
        await live.acquire(job, leases[job, group], group)
    b_waits = asyncio.ensure_future(live.acquire("b", leases["b", "g3"], "g3"))
    await live.waiting("b", "g3")
    a_waits = asyncio.ensure_future(live.acquire("a", leases["a", "g2"], "g2"))
    await live.waiting("a", "g2")  # a -> b -> c, and c waits for nothing
    assert not a_waits.done()
    assert not b_waits.done()

    await live.yield_("c", leases["c", "g3"], "g3")
    assert (await asyncio.wait_for(b_waits, 5)).group == "g3"
    await live.yield_("b", leases["b", "g2"], "g2")
    assert (await asyncio.wait_for(a_waits, 5)).group == "g2"
    assert not [e for g in groups for e in live.engine.groups[g].ring if e.kind == "failed"]


async def test_a_new_holder_that_closes_a_cycle_fails_the_waiter_now_waiting_on_it(
    live: Live,
) -> None:
    # b has two calls in flight (two threads of one job): one waits for g1, one for g2.
    leases = await _leases(live, "abc", ("g1", "g2"))
    await live.acquire("a", leases["a", "g1"], "g1")
    await live.acquire("c", leases["c", "g2"], "g2")
    b_g1 = asyncio.ensure_future(live.acquire("b", leases["b", "g1"], "g1"))
    await live.waiting("b", "g1")  # b -> a
    c_g1 = asyncio.ensure_future(live.acquire("c", leases["c", "g1"], "g1"))
    await live.waiting("c", "g1")  # c -> a
    b_g2 = asyncio.ensure_future(live.acquire("b", leases["b", "g2"], "g2"))
    await live.waiting("b", "g2")  # b -> c; no cycle yet: a waits for nothing

    await live.yield_("a", leases["a", "g1"], "g1")  # fifo: b holds g1, so c -> b -> c

    assert (await asyncio.wait_for(b_g1, 5)).job == "b"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(c_g1, 5)
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert caught.value.details().startswith(
        'deadlock: job "c" waits for group "g1" held by "b", which waits for group "g2" '
        'held by "c"; '
    )
    assert not b_g2.done()
    g1 = await live.group("g1")
    assert (g1.holder, list(g1.queue)) == ("b", [])
    await live.yield_("c", leases["c", "g2"], "g2")
    assert (await asyncio.wait_for(b_g2, 5)).group == "g2"


async def test_a_job_holding_nothing_is_never_aborted(live: Live) -> None:
    leases = await _leases(live, "abcd", ("g1",))
    await live.acquire("a", leases["a", "g1"], "g1")
    waits = []
    for job in "bcd":
        waits.append(asyncio.ensure_future(live.acquire(job, leases[job, "g1"], "g1")))
        await live.waiting(job, "g1")
    for holder in "abc":
        await live.yield_(holder, leases[holder, "g1"], "g1")
        await asyncio.sleep(0)
    granted = await asyncio.wait_for(asyncio.gather(*waits), 5)
    assert [g.job for g in granted] == ["b", "c", "d"]
