"""The event ring keeps entries packed (tuples the collector untracks) and gives back what
was recorded.

Cases: over random event sequences (hypothesis), iterating the ring gives every recorded
event's fields and an equal state, the newest `size` only, in order; a spec replaced by
PutGroup shows in later entries while earlier ones keep the old one, and an old spec is let
go once no entry names it; after a collection the ring's entries add no tracked objects
(the point of packing them); a live scheduler's GetEvents answers from the packed ring, a
Watch gets live entries, and the status of an old event is that of the state after it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlslice._errors import RlsliceError
from rlslice.config import GroupSpec, Policy
from rlslice.scheduler._runtime import EventEntry, EventRing
from rlslice.scheduler.core import GroupState, actions, events, new_group
from rlslice.v1alpha1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from conftest import Driver, Live

JOBS = ["a", "b", "c"]
job = st.sampled_from(JOBS)
op = st.one_of(
    st.tuples(st.just("register"), job),
    st.tuples(st.just("unregister"), job),
    st.tuples(st.just("acquire"), job),
    st.tuples(st.just("acquire"), job),
    st.tuples(st.just("yield"), job),
    st.tuples(st.just("keepalive"), job),
    st.tuples(st.just("tick"), st.floats(0, 12)),
    st.tuples(st.just("done"), st.booleans()),
    st.tuples(st.just("restore_failed"), st.booleans()),
    st.tuples(st.just("recover"), st.booleans()),
    st.tuples(st.just("put"), st.sampled_from(list(Policy))),
)


def _play(d: Driver, item: tuple[object, ...]) -> None:
    name, arg = item
    if name == "register":
        d.register(str(arg), lease=10.0)
    elif name == "unregister":
        d.apply(events.Unregister(str(arg)))
    elif name == "acquire":
        d.acquire(str(arg), phase="rollout")
    elif name == "yield":
        d.apply(events.Yield(str(arg)))
    elif name == "keepalive":
        d.apply(events.KeepAlive(str(arg)))
    elif name == "tick":
        d.advance(float(arg))  # type: ignore[arg-type]
    elif name == "done" and d.state.switch is not None:
        d.finish_switch(evict_all=bool(arg))
    elif name == "restore_failed" and d.state.switch is not None:
        d.apply(events.RestoreFailed(d.state.switch.epoch, "injected"))
    elif name == "recover":
        d.apply(events.Recover())
    elif name == "put":
        d.apply(events.PutGroup(GroupSpec(name="g", policy=arg, max_hold_seconds=5.0)))  # type: ignore[arg-type]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(op, max_size=50), size=st.sampled_from([1, 4, 64]))
def test_the_ring_gives_back_every_recorded_event_and_state(
    new: Callable[..., Driver], ops: list[tuple[object, ...]], size: int
) -> None:
    d = new(max_hold_seconds=5.0, yield_grace_seconds=1.0)
    ring = EventRing(size)
    recorded: list[EventEntry] = []
    for item in ops:
        start = len(d.log)
        try:
            _play(d, item)
        except RlsliceError:
            continue
        for action in d.log[start:]:
            if isinstance(action, actions.Record):
                entry = EventEntry(
                    len(recorded) + 1,
                    d.now,
                    "g",
                    action.kind.value,
                    action.job,
                    action.detail,
                    action.seconds,
                    action.bytes,
                    d.state,
                )
                ring.append(entry)
                recorded.append(entry)
    kept = list(ring)
    assert len(ring) == len(kept) == min(size, len(recorded))
    assert kept == recorded[len(recorded) - len(kept) :]


def test_a_replaced_spec_shows_from_its_event_on_and_old_specs_are_let_go() -> None:
    ring = EventRing(3)
    first = new_group(GroupSpec(name="g"))
    second = GroupState(spec=GroupSpec(name="g", policy=Policy.PRIORITY), epoch=4)
    ring.add(1, 1.0, "registered", "a", "", 0.0, 0, first)
    ring.add(2, 2.0, "group_put", "", "", 0.0, 0, second)
    assert [e.state for e in ring] == [first, second]
    assert [e.state.spec.policy for e in ring] == [Policy.FIFO, Policy.PRIORITY]
    ring.add(3, 3.0, "queued", "a", "", 0.0, 0, second)
    ring.add(4, 4.0, "queued", "b", "", 0.0, 0, second)  # the FIFO entry leaves the ring
    assert [e.seq for e in ring] == [2, 3, 4]
    assert list(ring._specs.values()) == [second.spec]


def test_packed_entries_add_no_tracked_objects(new: Callable[..., Driver]) -> None:
    d = new()
    for name in ("a", "b", "c"):
        d.register(name)
    ring = EventRing(2000)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(1000):
        ticket = d.acquire("abc"[i % 3])
        ring.add(2 * i, float(i), "queued", "a", "", 0.0, 0, d.state)
        if d.state.switch is not None:
            d.finish_switch(evict_all=False)
        d.apply(events.KeepAlive(d.open_calls.get(ticket, "a")))
        holder = d.state.holder
        assert holder is not None
        d.apply(events.Yield(holder))
        ring.add(2 * i + 1, float(i), "yielded", holder, "", 0.0, 0, d.state)
        d.log.clear()  # the driver's own memory is not under test
        d.grants.clear()
    # A tuple is untracked when a collection finds its items untracked; an entry whose
    # packed jobs were still tracked waits for the next pass (in a server, collections run
    # all the time, and each entry passes through two generations before the oldest).
    gc.collect()
    gc.collect()
    # 2,000 entries, each a distinct state: unpacked they were thousands of objects.
    assert len(gc.get_objects()) - before < 100
    assert len(ring) == 2000


async def test_get_events_and_watch_read_the_packed_ring(live: Live) -> None:
    a = await live.register("a")
    b = await live.register("b")
    stream = live.stub.Watch(pb.WatchRequest(group="g"))
    assert (await stream.read()).kind == pb.EVENT_KIND_SNAPSHOT
    await live.acquire("a", a)
    await live.yield_("a", a)
    await live.acquire("b", b)
    answer = await live.stub.GetEvents(pb.GetEventsRequest(group="g"))
    kinds = [e.kind for e in answer.events]
    assert kinds.count(pb.EVENT_KIND_REGISTERED) == 2
    assert [e.seq for e in answer.events] == sorted(e.seq for e in answer.events)
    granted = [e for e in answer.events if e.kind == pb.EVENT_KIND_GRANTED]
    assert [(e.job, e.status.holder) for e in granted] == [("a", "a"), ("b", "b")]
    yielded = next(e for e in answer.events if e.kind == pb.EVENT_KIND_YIELDED)
    assert yielded.status.holder == ""
    assert [j.job for j in yielded.status.jobs] == ["a", "b"]
    # The Watch opened after both registrations: it saw every later event, live.
    later = answer.events[kinds.index(pb.EVENT_KIND_REGISTERED) + 2 :]
    watched = [await stream.read() for _ in later]
    assert [(e.seq, e.kind, e.status.holder) for e in watched] == [
        (e.seq, e.kind, e.status.holder) for e in later
    ]
    stream.cancel()
