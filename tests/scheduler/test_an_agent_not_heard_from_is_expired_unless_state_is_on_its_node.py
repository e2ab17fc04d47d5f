"""Agent liveness, pure and live.

Pure: `agent_liveness.expired` names the nodes silent past the expiry (none when off) and
`split` keeps those a job's state is on. Live, three fake agents in a group without an
explicit node list: an agent that stopped renewing (its registration aged on the
scheduler's clock) is removed, and a handoff then goes through the other two only; an
expired agent with a parked job on it is kept, and the log says why, naming the node.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from rlslice.config import GroupSpec
from rlslice.scheduler.core import agent_liveness
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .test_coordinator import FAST, GIB, FakeAgent, FakeJob, agents

if TYPE_CHECKING:
    from conftest import Live

__all__ = ["agents"]  # the fixture


@pytest.mark.parametrize(
    ("heard", "now", "expiry", "want"),
    [
        ({"n1": 100.0, "n2": 50.0}, 200.0, 120.0, ["n2"]),
        ({"n1": 100.0, "n2": 80.0}, 200.0, 120.0, []),  # exactly at the expiry: alive
        ({"n2": 0.0, "n1": 0.0}, 200.0, 120.0, ["n1", "n2"]),
        ({"n1": 0.0}, 1e9, None, []),  # expiry off
        ({}, 200.0, 1.0, []),
    ],
)
def test_expired_names_the_silent_nodes(
    heard: dict[str, float], now: float, expiry: float | None, want: list[str]
) -> None:
    assert agent_liveness.expired(heard, now, expiry) == want


def test_split_keeps_the_nodes_state_is_on() -> None:
    why = {"n2": "job a of group g is parked on node n2"}
    assert agent_liveness.split(["n1", "n2", "n3"], why.get) == (["n1", "n3"], why)


async def _join(live: Live, fakes: list[FakeAgent]) -> None:
    for fake in fakes:
        await live.stub.RegisterAgent(
            pb.RegisterAgentRequest(node=fake.node, address=fake.address, backends=["sim"])
        )


def _silence(live: Live, node: str) -> None:
    """As if `node`'s agent stopped renewing an hour ago (the scheduler's clock)."""
    coordinator = live.running.coordinator
    record = coordinator.agents[node]
    coordinator.agents[node] = dataclasses.replace(
        record, registered_at=record.registered_at - 3600
    )


async def test_a_silent_agent_is_expired_and_handoffs_go_through_the_others(
    start_live: Callable[..., Any], agents: list[FakeAgent]
) -> None:
    async with start_live(agent_expiry_seconds=60, **FAST) as live:
        live.engine.put_group(GroupSpec(name="g"))
        await _join(live, agents)
        _silence(live, "n3")
        for fake in agents:
            fake.jobs["b"] = FakeJob(device=6 * GIB)
        a = await live.register("a", device_bytes=6 * GIB)
        b = await live.register("b", device_bytes=6 * GIB)
        await live.acquire("a", a)
        waiting = asyncio.ensure_future(live.acquire("b", b))
        await live.waiting("b")
        await live.yield_("a", a)
        await asyncio.wait_for(waiting, 5)
        assert list((await live.group()).nodes) == ["n1", "n2"]
        assert "n3" not in live.running.coordinator.agents
        assert agents[2].calls == []
        assert {c[0] for c in agents[0].calls} >= {"snapshot"}


async def test_an_expired_agent_with_a_parked_job_is_kept_naming_the_node(
    start_live: Callable[..., Any], agents: list[FakeAgent], caplog: pytest.LogCaptureFixture
) -> None:
    async with start_live(agent_expiry_seconds=60, **FAST) as live:
        live.engine.put_group(GroupSpec(name="g"))
        await _join(live, agents)
        for fake in agents:
            fake.jobs["b"] = FakeJob(device=6 * GIB)
        a = await live.register("a", device_bytes=6 * GIB)
        b = await live.register("b", device_bytes=6 * GIB)
        await live.acquire("a", a)
        waiting = asyncio.ensure_future(live.acquire("b", b))
        await live.waiting("b")
        await live.yield_("a", a)
        await asyncio.wait_for(waiting, 5)
        assert list((await live.group()).parked) == ["a"]
        _silence(live, "n3")
        with caplog.at_level(logging.WARNING, logger="rlslice.scheduler.coordinator"):
            assert list((await live.group()).nodes) == ["n1", "n2", "n3"]
        assert "n3" in live.running.coordinator.agents
        kept = [r.getMessage() for r in caplog.records if "kept" in r.getMessage()]
        assert kept
        assert "node n3" in kept[0]
        assert "job a of group g is parked on node n3" in kept[0]
