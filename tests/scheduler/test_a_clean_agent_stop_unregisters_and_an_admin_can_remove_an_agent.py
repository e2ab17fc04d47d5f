"""An agent leaves the scheduler on a clean stop, and `rlslice agent remove` takes one out.

Cases: a `SchedulerLink` that registered, stopped, unregisters its node; a stop while a
job's state is on the node leaves it registered (the scheduler refuses, naming the job).
`rlslice agent remove NODE` removes an idle node's agent, is refused FAILED_PRECONDITION
naming the job while a parked job is on it, and `--force` removes it anyway; an unknown
node is reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from rlslice.apps import agent_remove
from rlslice.config import GroupSpec
from rlslice.snapshot_agent.scheduler_link import SchedulerLink
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .test_coordinator import FAST, GIB, FakeAgent, FakeJob, agents

if TYPE_CHECKING:
    from conftest import Live

__all__ = ["agents"]  # the fixture


async def _join(live: Live, fakes: list[FakeAgent]) -> None:
    for fake in fakes:
        await live.stub.RegisterAgent(
            pb.RegisterAgentRequest(node=fake.node, address=fake.address, backends=["sim"])
        )


async def _a_parked(live: Live, fakes: list[FakeAgent]) -> None:
    live.engine.put_group(GroupSpec(name="g"))
    await _join(live, fakes)
    for fake in fakes:
        fake.jobs["b"] = FakeJob(device=6 * GIB)
    a = await live.register("a", device_bytes=6 * GIB)
    b = await live.register("b", device_bytes=6 * GIB)
    await live.acquire("a", a)
    waiting = asyncio.ensure_future(live.acquire("b", b))
    await live.waiting("b")
    await live.yield_("a", a)
    await asyncio.wait_for(waiting, 5)
    assert list((await live.group()).parked) == ["a"]


def _link(live: Live, node: str, address: str) -> SchedulerLink:
    async def request() -> pb.RegisterAgentRequest:
        return pb.RegisterAgentRequest(node=node, address=address, backends=["sim"])

    return SchedulerLink(live.running.address, request)


async def test_a_clean_stop_unregisters_the_node(start_live: Callable[..., Any]) -> None:
    async with start_live(**FAST) as live:
        link = _link(live, "n9", "127.0.0.1:1")
        link.start()
        assert await link.wait_registered(5)
        assert "n9" in live.running.coordinator.agents
        await link.stop()
        assert "n9" not in live.running.coordinator.agents


async def test_a_stop_with_state_on_the_node_stays_registered(
    start_live: Callable[..., Any], agents: list[FakeAgent]
) -> None:
    async with start_live(**FAST) as live:
        await _a_parked(live, agents)
        link = _link(live, "n3", agents[2].address)
        link.start()
        assert await link.wait_registered(5)
        await link.stop()
        assert "n3" in live.running.coordinator.agents


async def _remove(live: Live, *words: str) -> int:
    return await asyncio.to_thread(agent_remove.run, [*words, "--scheduler", live.running.address])


async def test_agent_remove_takes_an_idle_node_out(
    start_live: Callable[..., Any], agents: list[FakeAgent], capsys: pytest.CaptureFixture[str]
) -> None:
    async with start_live(**FAST) as live:
        live.engine.put_group(GroupSpec(name="g"))
        await _join(live, agents)
        assert await _remove(live, "n3") == 0
        assert "removed the agent of node n3" in capsys.readouterr().out
        assert list((await live.group()).nodes) == ["n1", "n2"]
        assert await _remove(live, "n3") == 1
        assert "no agent registered for node n3" in capsys.readouterr().err


async def test_agent_remove_is_refused_naming_the_job_unless_forced(
    start_live: Callable[..., Any], agents: list[FakeAgent], capsys: pytest.CaptureFixture[str]
) -> None:
    async with start_live(**FAST) as live:
        await _a_parked(live, agents)
        assert await _remove(live, "n3") == 1
        err = capsys.readouterr().err
        assert "FAILED_PRECONDITION" in err
        assert "job a of group g is parked on node n3" in err
        assert "n3" in live.running.coordinator.agents
        assert await _remove(live, "n3", "--force") == 0
        assert "n3" not in live.running.coordinator.agents
