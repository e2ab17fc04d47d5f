"""A live scheduler over three fake agents keeps a parked job's state where it is.

Cases: PutGroup changing the group's nodes while job a is parked on all three is refused
FAILED_PRECONDITION naming `spec.nodes` and a, and a's later grant restores its state on
every node it was parked on; an agent re-registering with labels that no longer match the
group's node selector while a is parked leaves the group on its old nodes (a is restored
there too), and once no state is left on them (b, parked, leaves: its copy is released on
the old node as well) the group takes the nodes its selector now matches. A job the spec
lists takes the admin's priority over the one it registers with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from rlslice.config import GroupSpec, JobSpec, Policy
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .test_coordinator import FAST, GIB, FakeAgent, FakeJob, agents

if TYPE_CHECKING:
    from conftest import Live

__all__ = ["agents"]  # the fixture


async def _join(live: Live, fakes: list[FakeAgent], pool: str = "x") -> None:
    for fake in fakes:
        await live.stub.RegisterAgent(
            pb.RegisterAgentRequest(
                node=fake.node, address=fake.address, backends=["sim"], labels={"pool": pool}
            )
        )


async def _a_parked(live: Live, fakes: list[FakeAgent], spec: GroupSpec) -> tuple[Any, Any]:
    """b holds g; a is parked on every node."""
    live.engine.put_group(spec)
    await _join(live, fakes)
    a = await live.register("a", device_bytes=6 * GIB)
    b = await live.register("b", device_bytes=6 * GIB)
    await live.acquire("a", a)
    waiting = asyncio.ensure_future(live.acquire("b", b))
    await live.waiting("b")
    await live.yield_("a", a)
    await asyncio.wait_for(waiting, 5)
    for fake in fakes:
        fake.jobs["b"] = FakeJob(device=6 * GIB)
    assert list((await live.group()).parked) == ["a"]
    return a, b


async def _a_comes_back(live: Live, a: Any, b: Any) -> Any:
    again = asyncio.ensure_future(live.acquire("a", a))
    await live.waiting("a")
    await live.yield_("b", b)
    return await asyncio.wait_for(again, 5)


async def test_put_group_changing_nodes_while_a_job_is_parked_is_refused(
    start_live: Callable[..., Any], agents: list[FakeAgent]
) -> None:
    async with start_live(**FAST) as live:
        a, b = await _a_parked(live, agents, GroupSpec(name="g"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await live.stub.PutGroup(
                pb.PutGroupRequest(spec=pb.GroupSpec(name="g", nodes=["n1", "n2"]))
            )
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = caught.value.details() or ""
        assert "spec.nodes" in details
        assert "'a' (parked)" in details
        assert list((await live.group()).nodes) == ["n1", "n2", "n3"]
        grant = await _a_comes_back(live, a, b)
        assert grant.restored is True
        for fake in agents:
            assert fake.moves()[-1] == ("restore", "a")
            assert fake.jobs["a"].device == 6 * GIB


async def test_a_reregistration_that_moves_the_selector_keeps_the_nodes_with_state(
    start_live: Callable[..., Any], agents: list[FakeAgent]
) -> None:
    n3 = agents[2]
    async with start_live(**FAST) as live:
        spec = GroupSpec(name="g", node_selector={"pool": "x"})
        a, b = await _a_parked(live, agents, spec)
        answer = await live.stub.RegisterAgent(
            pb.RegisterAgentRequest(
                node=n3.node, address=n3.address, backends=["sim"], labels={"pool": "y"}
            )
        )
        assert list(answer.groups) == ["g"]  # n3 keeps a's parked copy
        assert list((await live.group()).nodes) == ["n1", "n2", "n3"]
        grant = await _a_comes_back(live, a, b)
        assert grant.restored is True
        assert n3.moves()[-2:] == [("snapshot", "b"), ("restore", "a")]
        await live.stub.Unregister(pb.UnregisterRequest(lease_id=b.lease_id, secret=b.secret))
        async with asyncio.timeout(5):  # the release runs after the transition's last event
            # b's copy on n3 is dropped (the fake agent has no event to wait on)
            while ("b", True) not in n3.releases:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert list((await live.group()).nodes) == ["n1", "n2"]


async def test_a_listed_job_keeps_the_admins_priority_whatever_it_registers_with(
    start_live: Callable[..., Any],
) -> None:
    async with start_live(**FAST) as live:
        live.engine.put_group(
            GroupSpec(name="g", policy=Policy.PRIORITY, jobs=(JobSpec(name="a", priority=2),))
        )
        await live.register("a", priority=900, weight=5.0)
        await live.register("b", priority=7)
        jobs = live.engine.groups["g"].state.jobs
        assert (jobs["a"].priority, jobs["a"].weight) == (2, 1.0)
        assert jobs["b"].priority == 7
