"""Shared helpers for scheduler tests: a driver around the pure core that remembers what
callers saw (open calls, grants, failures)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from rlslice._errors import RlsliceError
from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState, actions, events, new_group, step


@dataclass
class Driver:
    """Feeds events to one group and remembers what the callers would have seen."""

    state: GroupState
    now: float = 1000.0
    ticket: int = 0
    open_calls: dict[int, str] = field(default_factory=dict)
    grants: list[actions.Grant] = field(default_factory=list)
    fails: list[actions.Fail] = field(default_factory=list)
    log: list[actions.Action] = field(default_factory=list)

    @classmethod
    def for_spec(cls, **spec: object) -> Driver:
        return cls(new_group(GroupSpec(name="g", **spec)))  # type: ignore[arg-type]

    def apply(self, event: events.Event) -> tuple[actions.Action, ...]:
        transition = step(self.state, event, self.now)
        assert transition.state is not None
        self.state = transition.state
        for action in transition.actions:
            self.log.append(action)
            if isinstance(action, actions.Grant):
                assert self.open_calls.pop(action.ticket) == action.job
                self.grants.append(action)
            elif isinstance(action, actions.Fail):
                if action.ticket in self.open_calls:
                    del self.open_calls[action.ticket]
                self.fails.append(action)
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
