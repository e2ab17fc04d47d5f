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
- a job that holds nothing never gets ABORTED, however many wait;
- sessions: two processes of one job (each its own session) that hold and wait
  independently are not a cycle, and both waits are granted as the holds end; the same
  waits from one session are; a malformed session is INVALID_ARGUMENT naming the field.
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


async def test_independent_processes_of_one_job_are_not_mistaken_for_a_cycle(
    live: Live,
) -> None:
    # Job x's trainer (session t) holds g1 and job y's sampler (session s) holds g2; x's
    # sampler waits for g2 and y's trainer for g1. By job name that is x -> y -> x, but
    # neither holding process waits for anything: both holds end, both waits are granted.
    x_g1 = await live.register("x", "g1", session="x-trainer")
    y_g2 = await live.register("y", "g2", session="y-sampler")
    x_g2 = await live.register("x", "g2", session="x-sampler")
    y_g1 = await live.register("y", "g1", session="y-trainer")
    await live.acquire("x", x_g1, "g1")
    await live.acquire("y", y_g2, "g2")
    x_waits = asyncio.ensure_future(live.acquire("x", x_g2, "g2"))
    await live.waiting("x", "g2")
    y_waits = asyncio.ensure_future(live.acquire("y", y_g1, "g1"))
    await live.waiting("y", "g1")
    assert not x_waits.done()  # waiting, not aborted
    assert not y_waits.done()

    await live.yield_("x", x_g1, "g1")
    assert (await asyncio.wait_for(y_waits, 5)).group == "g1"
    await live.yield_("y", y_g2, "g2")
    assert (await asyncio.wait_for(x_waits, 5)).group == "g2"
    assert not [e for g in ("g1", "g2") for e in live.engine.groups[g].ring if e.kind == "failed"]


async def test_one_session_holding_and_waiting_across_groups_is_still_a_cycle(
    live: Live,
) -> None:
    a_g1 = await live.register("a", "g1", session="a-main")
    a_g2 = await live.register("a", "g2", session="a-main")
    b_g1 = await live.register("b", "g1", session="b-main")
    b_g2 = await live.register("b", "g2", session="b-main")
    await live.acquire("a", a_g1, "g1")
    await live.acquire("b", b_g2, "g2")
    a_waits = asyncio.ensure_future(live.acquire("a", a_g2, "g2"))
    await live.waiting("a", "g2")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await live.acquire("b", b_g1, "g1")
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert caught.value.details() == TWO  # job ids in the message, never sessions
    a_waits.cancel()


@pytest.mark.parametrize("session", ["has space", "x" * 65, "slash/inside", "é"])
async def test_a_malformed_session_is_refused_naming_the_field(live: Live, session: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await live.register("a", "g1", session=session)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("session: ")
    assert "g1" not in live.engine.groups  # refused before anything, even auto-creation
