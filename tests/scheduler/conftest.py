"""Shared helpers for scheduler tests: a driver around the pure core that remembers what
callers saw (open calls, grants, failures)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from rlslice._errors import RlsliceError
from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState, actions, events, new_group, step
from rlslice.scheduler.core.registration import AgentSurvey


@dataclass
class Driver:
    """Feeds events to one group and remembers what the callers would have seen."""

    state: GroupState
    now: float = 1000.0
    ticket: int = 0
    open_calls: dict[int, str] = field(default_factory=dict)
    grants: list[actions.GrantAction] = field(default_factory=list)
    fails: list[actions.Fail] = field(default_factory=list)
    log: list[actions.Action] = field(default_factory=list)
    prefetch_fits: bool = False
    """False: the driver's coordinator finds no room beside the holder and answers every
    prefetch with PrefetchSkipped at once (so tests of plain switches see none)."""

    @classmethod
    def for_spec(cls, **spec: object) -> Driver:
        return cls(new_group(GroupSpec(name="g", **spec)))  # type: ignore[arg-type]

    def apply(self, event: events.Event) -> tuple[actions.Action, ...]:
        transition = step(self.state, event, self.now)
        assert transition.state is not None
        self.state = transition.state
        for action in transition.actions:
            self.log.append(action)
            if isinstance(action, actions.GrantAction):
                if action.ticket is not None:  # None: a resumed switch, its caller gone
                    assert self.open_calls.pop(action.ticket) == action.job
                self.grants.append(action)
            elif isinstance(action, actions.Fail):
                if action.ticket in self.open_calls:
                    del self.open_calls[action.ticket]
                self.fails.append(action)
        for action in transition.actions:
            if (
                isinstance(action, actions.StartSwitch)
                and action.switch.purpose == "prefetch"
                and not self.prefetch_fits
                and self.state.switch == action.switch
            ):
                self.apply(events.PrefetchSkipped(action.switch.epoch, "no room (driver)"))
        return transition.actions

    def register(self, job: str, lease: float = 30.0, **kw: object) -> None:
        self.apply(events.Register(job, f"lease-{job}", "hash", lease, **kw))  # type: ignore[arg-type]

    def acquire(self, job: str, phase: str = "") -> int:
        self.ticket += 1
        self.open_calls[self.ticket] = job
        try:
            self.apply(events.Acquire(job, self.ticket, phase))
        except RlsliceError:
            del self.open_calls[self.ticket]
            raise
        return self.ticket

    def cancel(self, ticket: int) -> None:
        job = self.open_calls.pop(ticket)
        self.apply(events.Cancel(job, ticket))

    def switch(self) -> actions.StartSwitch | None:
        """The last StartSwitch emitted, if the group is switching."""
        for action in reversed(self.log):
            if isinstance(action, actions.StartSwitch):
                return action if self.state.switch == action.switch else None
        return None

    def finish_switch(self, *, evict_all: bool = True, seconds: float = 0.01) -> None:
        sw = self.state.switch
        assert sw is not None
        evicted = sw.evict + (sw.candidates if evict_all else ())
        self.apply(events.SwitchDone(sw.epoch, evicted, moved_bytes=100, seconds=seconds))

    def advance(self, seconds: float) -> tuple[actions.Action, ...]:
        self.now += seconds
        return self.apply(events.Tick())

    def kinds(self) -> list[str]:
        return [a.kind.value for a in self.log if isinstance(a, actions.Record)]


@pytest.fixture
def new() -> Callable[..., Driver]:
    """Makes a driver over a fresh group named "g" with the given spec fields."""
    return Driver.for_spec


# -- a live scheduler on loopback ---------------------------------------------------------


@dataclass
class Live:
    """A running scheduler and a raw stub to it."""

    running: Any
    channel: Any
    stub: Any

    @property
    def engine(self) -> Any:
        return self.running.engine

    async def register(self, job: str, group: str = "g", **kw: Any) -> Any:
        from rlslice.v1alpha1 import scheduler_pb2 as pb

        return await self.stub.Register(pb.RegisterRequest(job=job, group=group, **kw))

    async def acquire(self, job: str, lease: Any, group: str = "g", **kw: Any) -> Any:
        from rlslice.v1alpha1 import scheduler_pb2 as pb

        request = pb.AcquireRequest(
            job=job, group=group, lease_id=lease.lease_id, secret=lease.secret
        )
        return await self.stub.Acquire(request, **kw)

    async def yield_(self, job: str, lease: Any, group: str = "g") -> Any:
        from rlslice.v1alpha1 import scheduler_pb2 as pb

        request = pb.YieldRequest(
            job=job, group=group, lease_id=lease.lease_id, secret=lease.secret
        )
        return await self.stub.Yield(request)

    async def waiting(self, job: str, group: str = "g", timeout: float = 5.0) -> None:
        """Return once `job`'s Acquire has reached the scheduler (queued, switching in, or
        granted), woken by the group's events rather than by sleeping."""
        events = self.engine.watch(group)
        try:
            while not self._arrived(job, group):
                await asyncio.wait_for(events.get(), timeout)
        finally:
            self.engine.unwatch(group, events)

    async def until(
        self, condition: Callable[[], object], group: str = "g", timeout: float = 5.0
    ) -> None:
        """Return once `condition()` holds, checked after each of the group's events (every
        transition records one), never by polling."""
        events = self.engine.watch(group)
        try:
            while not condition():
                await asyncio.wait_for(events.get(), timeout)
        finally:
            self.engine.unwatch(group, events)

    def _arrived(self, job: str, group: str) -> bool:
        s = self.engine.groups[group].state
        switching = s.switch is not None and s.switch.incoming == job and s.switch.ticket
        return (
            s.holder == job or bool(switching) or any(w.job == job and w.attached for w in s.queue)
        )

    async def group(self, name: str = "g") -> Any:
        from rlslice.v1alpha1 import scheduler_pb2 as pb

        return await self.stub.GetGroup(pb.GetGroupRequest(group=name))


@contextlib.asynccontextmanager
async def live_scheduler(token: str | None = None, **settings: Any) -> AsyncIterator[Live]:
    """A scheduler on 127.0.0.1:0 (auto-creating groups unless told otherwise)."""
    from rlslice.adapters.channel import open_channel
    from rlslice.scheduler import SchedulerSettings, start_scheduler
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    fields: dict[str, Any] = {"address": "127.0.0.1:0", "auto_create_groups": True}
    fields.update(settings)
    running = await start_scheduler(SchedulerSettings(**fields))
    channel = open_channel(running.address, token=token)
    try:
        yield Live(running, channel, scheduler_pb2_grpc.SchedulerStub(channel))
    finally:
        await running.stop(0.1)
        await channel.close()


@pytest.fixture
async def live() -> AsyncIterator[Live]:
    """A scheduler in auto-create mode with a memory store."""
    async with live_scheduler() as value:
        yield value


@pytest.fixture
def start_live() -> Callable[..., contextlib.AbstractAsyncContextManager[Live]]:
    """`async with start_live(**settings) as live:` for tests that need their own settings."""
    return live_scheduler


# -- an engine in this process, no gRPC: for tests on the loop's clock (looptime) ---------


@dataclass
class Runner:
    """A coordinator stand-in. With no `nodes`, switches are pure lock handoffs; with nodes,
    every switch succeeds at once and releases are recorded."""

    nodes: tuple[str, ...] = ()
    releases: list[tuple[str, bool]] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def nodes_for(self, spec: GroupSpec) -> tuple[str, ...]:
        return self.nodes

    async def run_switch(self, state: GroupState, switch: Any) -> events.Event:
        return events.SwitchDone(switch.epoch, switch.evict + switch.candidates)

    async def release(self, spec: GroupSpec, job: str, force: bool) -> None:
        self.releases.append((job, force))
        self.released.set()

    async def survey(self, spec: GroupSpec) -> AgentSurvey:
        return AgentSurvey()


@contextlib.asynccontextmanager
async def engine_on_loop(runner: Runner | None = None, **kw: Any) -> AsyncIterator[Any]:
    """A started, recovered engine over a memory store, in auto-create mode."""
    from rlslice.scheduler.engine import Engine
    from rlslice.scheduler.metrics import SchedulerMetrics
    from rlslice.scheduler.store import MemoryStore

    metrics = SchedulerMetrics()
    engine = Engine(
        kw.pop("store", None) or MemoryStore(),
        runner or Runner(),
        metrics,
        auto_create_groups=True,
        **kw,
    )
    await engine.start()
    engine.recover()
    try:
        yield engine
    finally:
        await engine.close()
        metrics.close()


@pytest.fixture
async def engine() -> AsyncIterator[Any]:
    """An in-process engine with no agents (every switch a pure lock handoff)."""
    async with engine_on_loop() as value:
        yield value
