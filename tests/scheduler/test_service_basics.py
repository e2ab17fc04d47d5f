"""The scheduler service over real gRPC on loopback.

Cases: health is SERVING once started and the address has the real port; register,
acquire, yield round trip (first grant switches, then resident grants are immediate); a
blocked acquire is granted when the holder yields (handoff) and the event ring records it;
a waiter whose deadline passes or who cancels leaves the queue at once; a grant whose
caller left is given back; Watch starts with a SNAPSHOT and streams events; ListGroups and
GetEvents; reflection lists the service. (Lease lapses and keep-alives run on the loop's
fake clock: test_engine_clock.py.)
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlslice.v1alpha1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from conftest import Live


async def test_health_is_serving_and_the_address_has_the_real_port(live: Live) -> None:
    assert not live.running.address.endswith(":0")
    health = health_pb2_grpc.HealthStub(live.channel)
    for service in ("", "rlslice.v1alpha1.Scheduler"):
        answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


async def test_register_acquire_yield_round_trip(live: Live) -> None:
    lease = await live.register("a", lease_seconds=30)
    assert lease.lease_seconds == 30
    assert len(lease.secret) >= 32
    first = await live.acquire("a", lease)
    assert (first.job, first.group, first.restored) == ("a", "g", False)
    status = await live.group()
    assert status.holder == "a"
    assert status.phase == "Held"
    answer = await live.yield_("a", lease)
    assert (answer.waiters, answer.snapshot_deferred) == (0, True)
    second = await live.acquire("a", lease)
    assert second.epoch == first.epoch + 1
    assert (await live.group()).resident == ["a"]


async def test_a_blocked_acquire_is_granted_when_the_holder_yields(live: Live) -> None:
    a = await live.register("a")
    b = await live.register("b")
    await live.acquire("a", a)
    waiting = asyncio.ensure_future(live.acquire("b", b))
    await live.until(lambda: live.engine.groups["g"].state.queue)
    assert list((await live.group()).queue) == ["b"]
    assert not waiting.done()
    answer = await live.yield_("a", a)
    assert answer.waiters == 1
    grant = await asyncio.wait_for(waiting, 5)
    assert grant.job == "b"
    assert grant.waited_seconds > 0
    kinds = [e.kind for e in (await live.stub.GetEvents(pb.GetEventsRequest(group="g"))).events]
    assert pb.EVENT_KIND_QUEUED in kinds
    assert kinds[-1] == pb.EVENT_KIND_GRANTED


@pytest.mark.parametrize("how", ["deadline", "cancel"])
async def test_a_waiter_that_gives_up_leaves_the_queue_at_once(live: Live, how: str) -> None:
    a = await live.register("a")
    b = await live.register("b")
    await live.acquire("a", a)
    if how == "deadline":
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await live.acquire("b", b, timeout=0.2)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    else:
        call = live.stub.Acquire(
            pb.AcquireRequest(job="b", group="g", lease_id=b.lease_id, secret=b.secret)
        )
        await live.until(lambda: live.engine.groups["g"].state.queue)
        call.cancel()
    await live.until(lambda: not live.engine.groups["g"].state.queue, timeout=1.0)
    status = await live.group()
    assert list(status.queue) == []
    assert (await live.yield_("a", a)).snapshot_deferred is True


async def test_a_grant_whose_caller_left_is_given_back(live: Live) -> None:
    a = await live.register("a")
    grant = await live.acquire("a", a)
    live.engine.lost_grant("g", "a", grant.epoch - 1)  # a stale report changes nothing
    assert live.engine.groups["g"].state.holder == "a"
    live.engine.lost_grant("g", "a", grant.epoch)
    assert live.engine.groups["g"].state.holder is None


async def test_watch_starts_with_a_snapshot_and_streams_events(live: Live) -> None:
    a = await live.register("a")
    stream = live.stub.Watch(pb.WatchRequest(group="g"))
    first = await stream.read()
    assert first.kind == pb.EVENT_KIND_SNAPSHOT
    assert [j.job for j in first.status.jobs] == ["a"]
    await live.acquire("a", a)
    kinds = []
    while pb.EVENT_KIND_GRANTED not in kinds:
        event = await asyncio.wait_for(stream.read(), 5)
        kinds.append(event.kind)
    assert event.status.holder == "a"
    assert event.seq > 0
    stream.cancel()


async def test_list_groups_and_get_events_limit(live: Live) -> None:
    for name in ("g", "h"):
        await live.register("a", group=name)
    listed = await live.stub.ListGroups(pb.ListGroupsRequest())
    assert [g.spec.name for g in listed.groups] == ["g", "h"]
    events = await live.stub.GetEvents(pb.GetEventsRequest(group="g", limit=1))
    assert len(events.events) == 1
    assert events.events[0].kind == pb.EVENT_KIND_REGISTERED


async def test_a_forced_delete_fails_the_holder_and_waiters(live: Live) -> None:
    a = await live.register("a")
    b = await live.register("b")
    await live.acquire("a", a)
    waiting = asyncio.ensure_future(live.acquire("b", b))
    await live.until(lambda: live.engine.groups["g"].state.queue)
    watch = live.stub.Watch(pb.WatchRequest())  # every group
    assert (await watch.read()).kind == pb.EVENT_KIND_SNAPSHOT
    await live.stub.DeleteGroup(pb.DeleteGroupRequest(group="g", force=True))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await waiting
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert (await asyncio.wait_for(watch.read(), 5)).kind == pb.EVENT_KIND_GROUP_DELETED
    watch.cancel()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await live.yield_("a", a)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "g" not in live.engine.groups
