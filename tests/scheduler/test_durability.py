"""Nothing is granted that could not be persisted (`scheduler/_durability.py`), under a real
store whose Nth commit fails: a `MemoryStore` that commits at once (as SQLite does) and
one that writes in the background (as the Kubernetes store does).

Cases:
- at once: the refused transition changes nothing, its caller is answered UNAVAILABLE
  naming the store, and the next commit goes through;
- in the background: a switch start and a grant are held (not run, not answered) until
  their commits land;
- in the background, the Nth commit fails: for the grant, its caller fails UNAVAILABLE
  and the group is free again; for a switch start, the switch never moves anything and
  the waiter is served by the retry; every refusal counted, the store reported unhealthy
  while it is.

A job's first grant takes two commits: the switch that brings it in (a pure handoff
without agents), then the grant.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from rlslice._errors import UnavailableError
from rlslice.scheduler.core import GroupState, events
from rlslice.scheduler.store import MemoryStore, StoreError

from .conftest import Runner, engine_on_loop

pytestmark = pytest.mark.looptime


class FailsAtOnce(MemoryStore):
    """Commits at once; the `fail_at`th commit (counted from 1) is refused."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.commits = fail_at, 0

    def commit_now(self, group: str) -> bool:
        self.commits += 1
        if self.commits == self.fail_at:
            raise StoreError(f"test store: commit {self.commits} of {group} refused")
        return True


class InBackground(MemoryStore):
    """Writes in the background: each commit waits for `gate`; the `fail_at`th fails."""

    def __init__(self, fail_at: int = 0) -> None:
        super().__init__()
        self.fail_at, self.commits = fail_at, 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.failed = False

    @property
    def healthy(self) -> bool:
        return not self.failed

    def commit_now(self, group: str) -> bool:
        return False

    async def commit(self, group: str) -> None:
        self.commits += 1
        number = self.commits
        await self.gate.wait()
        self.failed = number == self.fail_at
        if self.failed:
            raise StoreError(f"test store: commit {number} of {group} refused")


@dataclass
class Moving(Runner):
    """A group with one node; records each switch it runs."""

    nodes: tuple[str, ...] = ("n1",)
    switched: list[str] = field(default_factory=list)

    async def run_switch(self, state: GroupState, switch: Any) -> events.Event:
        self.switched.append(switch.incoming)
        return await super().run_switch(state, switch)


async def test_a_commit_refused_at_once_changes_nothing_and_the_next_goes_through() -> None:
    store = FailsAtOnce(fail_at=1)
    async with engine_on_loop(store=store) as engine:
        a = engine.register("g", "a", 30, None, None, 0)
        with pytest.raises(UnavailableError, match="commit 1 of g refused") as refused:
            await engine.acquire("g", "a", a.lease_id, a.secret, "")
        assert "nothing changed" in str(refused.value)
        assert engine.groups["g"].state.holder is None
        assert engine.metrics.store_refusals._value.get() == 1
        grant = await engine.acquire("g", "a", a.lease_id, a.secret, "")
        assert engine.groups["g"].state.holder == "a"
        assert store.groups["g"].epoch == grant.epoch  # what was granted is what is stored


async def test_a_grant_and_its_switch_are_held_until_their_background_commits_land() -> None:
    store = InBackground()
    store.gate.clear()
    async with engine_on_loop(store=store) as engine:
        a = engine.register("g", "a", 30, None, None, 0)
        acquiring = asyncio.ensure_future(engine.acquire("g", "a", a.lease_id, a.secret, ""))
        await asyncio.sleep(1)
        assert store.commits == 1  # the switch bringing a in waits for its write
        assert not acquiring.done()  # decided, stored not yet: not answered
        store.gate.set()
        grant = await acquiring
        assert grant.job == "a"
        assert engine.groups["g"].state.holder == "a"


async def test_a_failed_background_commit_of_a_grant_gives_it_back() -> None:
    store = InBackground(fail_at=2)  # 1: the switch bringing a in; 2: its grant
    async with engine_on_loop(store=store) as engine:
        a = engine.register("g", "a", 30, None, None, 0)
        with pytest.raises(UnavailableError, match="commit 2 of g refused") as refused:
            await engine.acquire("g", "a", a.lease_id, a.secret, "")
        assert "not granted" in str(refused.value)
        assert engine.groups["g"].state.holder is None
        assert engine.metrics.store_refusals._value.get() == 1
        assert engine.metrics.store_healthy._value.get() == 0
        await engine.acquire("g", "a", a.lease_id, a.secret, "")  # commits 3 and 4 land
        assert engine.groups["g"].state.holder == "a"
        assert engine.metrics.store_healthy._value.get() == 1


async def test_a_failed_background_commit_of_a_switch_start_moves_nothing_and_is_retried() -> None:
    store = InBackground(fail_at=3)  # 1, 2: a's switch in and grant; 3: the switch to b
    runner = Moving()
    async with engine_on_loop(runner=runner, store=store) as engine:
        a = engine.register("g", "a", 30, None, None, 0)
        b = engine.register("g", "b", 30, None, None, 0)
        await engine.acquire("g", "a", a.lease_id, a.secret, "")
        waiting = asyncio.ensure_future(engine.acquire("g", "b", b.lease_id, b.secret, ""))
        await asyncio.sleep(0)
        engine.yield_("g", "a", a.lease_id, a.secret)
        grant = await asyncio.wait_for(waiting, 10)
        assert grant.job == "b"
        assert runner.switched == ["a", "b"]  # the refused start never ran; its retry did
        assert engine.metrics.store_refusals._value.get() == 1
        assert engine.groups["g"].state.holder == "b"
