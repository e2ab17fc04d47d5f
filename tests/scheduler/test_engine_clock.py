"""The engine keeps time on the loop's clock only, so these tests fake it (`looptime`).

Cases: state's times are Unix times read from the loop (`LoopClock`); a lapsed holder loses
the lock to the next waiter exactly at its lease's deadline; keep-alives renew a lease past
its first deadline and unregister frees the lock; a holder past max-hold is asked to yield,
then preempted exactly when the yield grace ends, its late Yield accepted and its next
Acquire served; a lapsed lease releases the job's state
without force, an unregister with force; a tick the store refuses is retried on the same
clock; a restart whose recovery the store refuses stays unready (UNAVAILABLE) until the
store is back, then resumes its switch.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from rlslice._errors import NotFoundError, UnavailableError
from rlslice.config import GroupSpec
from rlslice.scheduler.clock import LoopClock
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.engine import STORE_RETRY_SECONDS, Engine
from rlslice.scheduler.metrics import SchedulerMetrics
from rlslice.scheduler.service import SchedulerService
from rlslice.scheduler.store import MemoryStore, StoreError
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .conftest import Runner, engine_on_loop

pytestmark = pytest.mark.looptime


def _kinds(engine: Any, group: str = "g") -> list[str]:
    return [entry.kind for entry in engine.groups[group].ring]


async def test_the_clock_reads_unix_time_off_the_loop() -> None:
    loop = asyncio.get_running_loop()
    clock = LoopClock()
    before = clock.now()
    assert abs(before - time.time()) < 60  # Unix time, whatever the loop's epoch
    await asyncio.sleep(42)  # fake: looptime moves the loop, not the wall
    assert clock.now() - before == pytest.approx(42, abs=1e-3)
    assert clock.loop_time(clock.now()) == pytest.approx(loop.time(), abs=1e-3)


async def test_a_lapsed_holder_loses_the_lock_to_the_next_waiter_at_its_deadline(
    engine: Any,
) -> None:
    loop = asyncio.get_running_loop()
    a = engine.register("g", "a", 0.3, None, None, 0)
    b = engine.register("g", "b", 30, None, None, 0)
    await engine.acquire("g", "a", a.lease_id, a.secret, "")
    started = loop.time()
    grant = await engine.acquire("g", "b", b.lease_id, b.secret, "")
    assert grant.job == "b"
    assert loop.time() - started == pytest.approx(0.3, abs=1e-3)
    assert list(engine.groups["g"].state.jobs) == ["b"]
    with pytest.raises(NotFoundError):
        engine.yield_("g", "a", a.lease_id, a.secret)
    assert Kind.LEASE_EXPIRED.value in _kinds(engine)


async def test_keepalives_renew_a_lease_past_its_deadline_and_unregister_frees_the_lock(
    engine: Any,
) -> None:
    a = engine.register("g", "a", 0.5, None, None, 0)
    b = engine.register("g", "b", 30, None, None, 0)
    await engine.acquire("g", "a", a.lease_id, a.secret, "")
    for _ in range(4):  # 0.8 s in all, past the first deadline
        await asyncio.sleep(0.2)
        ttl, asked, _ = engine.keepalive(a.lease_id, a.secret)
        assert ttl == pytest.approx(0.5, abs=1e-3)
        assert asked is False
    assert engine.groups["g"].state.holder == "a"
    waiting = asyncio.ensure_future(engine.acquire("g", "b", b.lease_id, b.secret, ""))
    await asyncio.sleep(0)
    engine.unregister(a.lease_id, a.secret)
    assert (await waiting).job == "b"


async def test_a_holder_past_max_hold_is_asked_to_yield_then_preempted_when_grace_ends(
    engine: Any,
) -> None:
    loop = asyncio.get_running_loop()
    engine.put_group(GroupSpec(name="g", max_hold_seconds=0.2, yield_grace_seconds=0.3))
    a = engine.register("g", "a", 30, None, None, 0)
    b = engine.register("g", "b", 30, None, None, 0)
    await engine.acquire("g", "a", a.lease_id, a.secret, "")
    started = loop.time()
    waiting = asyncio.ensure_future(engine.acquire("g", "b", b.lease_id, b.secret, ""))
    await asyncio.sleep(0.25)  # past max-hold, inside the grace
    service = SchedulerService(engine, Runner())  # type: ignore[arg-type]
    keep = pb.KeepAliveRequest(lease_id=a.lease_id, secret=a.secret)
    answer = await service.KeepAlive(keep, None)  # type: ignore[arg-type]
    assert answer.yield_requested is True
    assert answer.preempt_in_seconds == pytest.approx(0.25, abs=1e-3)
    grant = await waiting
    assert grant.job == "b"
    assert loop.time() - started == pytest.approx(0.5, abs=1e-3)
    assert engine.keepalive(a.lease_id, a.secret)[1] is True
    assert engine.yield_("g", "a", a.lease_id, a.secret).snapshot_deferred is False
    again = asyncio.ensure_future(engine.acquire("g", "a", a.lease_id, a.secret, ""))
    await asyncio.sleep(0)
    engine.yield_("g", "b", b.lease_id, b.secret)
    assert (await again).job == "a"
    kinds = _kinds(engine)
    assert Kind.YIELD_REQUESTED.value in kinds
    assert Kind.PREEMPTED.value in kinds


async def test_a_lapsed_lease_releases_without_force_and_an_unregister_with_force() -> None:
    runner = Runner(nodes=("n1",))
    async with engine_on_loop(runner) as engine:
        engine.register("g", "a", 0.2, None, None, 0)
        b = engine.register("g", "b", 30, None, None, 0)
        engine.unregister(b.lease_id, b.secret)
        await runner.released.wait()
        assert runner.releases == [("b", True)]
        runner.released.clear()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await runner.released.wait()
        assert loop.time() - started == pytest.approx(0.2, abs=1e-3)
        assert runner.releases == [("b", True), ("a", False)]


class _Refusing(MemoryStore):
    """A store whose commits fail while `down`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def commit_now(self, group: str) -> bool:
        if self.down:
            raise StoreError("disk gone (test)")
        return True


async def test_a_tick_the_store_refuses_is_applied_again_on_the_loops_clock() -> None:
    store = _Refusing()
    async with engine_on_loop(store=store) as engine:
        loop = asyncio.get_running_loop()
        a = engine.register("g", "a", 0.3, None, None, 0)
        b = engine.register("g", "b", 30, None, None, 0)
        await engine.acquire("g", "a", a.lease_id, a.secret, "")
        store.down = True
        started = loop.time()
        waiting = asyncio.ensure_future(engine.acquire("g", "b", b.lease_id, b.secret, ""))
        await asyncio.sleep(0.3 + STORE_RETRY_SECONDS / 2)  # lapsed, grant refused once
        assert not waiting.done()
        assert engine.groups["g"].state.holder == "a"
        store.down = False
        assert (await waiting).job == "b"
        assert loop.time() - started == pytest.approx(0.3 + STORE_RETRY_SECONDS, abs=1e-3)


@dataclass
class _Stalled(Runner):
    """The first switch succeeds; the next ones never end (until the engine closes), so one
    stays in flight when the engine "dies"."""

    calls: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def run_switch(self, state: Any, switch: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            return await super().run_switch(state, switch)
        self.started.set()
        await asyncio.Event().wait()
        return None


async def test_a_restart_whose_recovery_the_store_refuses_is_not_ready_until_the_store_is_back() -> (
    None
):
    store = _Refusing()
    nodes = ("n1",)
    async with engine_on_loop(runner=_Stalled(nodes=nodes), store=store) as first:
        a = first.register("g", "a", 30, None, None, 0)
        b = first.register("g", "b", 30, None, None, 0)
        await first.acquire("g", "a", a.lease_id, a.secret, "")
        waiting = asyncio.ensure_future(first.acquire("g", "b", b.lease_id, b.secret, ""))
        first.yield_("g", "a", a.lease_id, a.secret)
        await first.runner.started.wait()
        assert first.groups["g"].state.switch is not None  # in flight when it "dies"
    with pytest.raises(UnavailableError):
        await waiting  # "shutting down": b's call is gone, b keeps its turn in the state
    store.down = True
    # Restarted with the group's nodes gone (a lock-only group now), the resumed switch is a
    # pure handoff that grants at once, inside the recovery: that grant must be committed.
    second = Engine(store, Runner(), SchedulerMetrics(), auto_create_groups=True)
    await second.start()
    try:
        second.recover()  # resuming the switch must be committed: refused, not raised
        assert not second.ready
        await asyncio.sleep(STORE_RETRY_SECONDS * 3)
        assert not second.ready
        await asyncio.sleep(STORE_RETRY_SECONDS / 2)  # between two retries (fake time)
        store.down = False
        await asyncio.sleep(STORE_RETRY_SECONDS)  # the next retry recovers, the switch runs
        assert second.ready
        assert second.groups["g"].state.switch is None
        assert second.groups["g"].state.holder == "b"  # the resumed switch granted it
    finally:
        await second.close()
