"""Bearer tokens on every gRPC path, and refusals that change nothing.

Scheduler with a job, an admin and an agent token: every method of the Scheduler service
is called with no token, an unknown token, and each role's token (table); a missing or
unknown token is UNAUTHENTICATED, a token of a role the method does not accept is
PERMISSION_DENIED (the admin token is accepted everywhere), and after every refusal each
group's state and the known agents are exactly as before. Health needs no token.

Agent with an agent token: every Agent method without it, or with another token, is
UNAUTHENTICATED, and a refused Snapshot leaves the job running (its process not stopped,
Status unchanged). The scheduler presents its agent token to agents: with the right one a
switch moves state; with a wrong one the agent refuses, the waiter gets a reason naming
the node, and the outgoing job keeps running. An agent presents its token to the
scheduler's RegisterAgent: with a wrong one it is never registered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlslice import FailedPreconditionError
from rlslice.adapters.channel import open_channel
from rlslice.client import AsyncClient
from rlslice.config import GroupSpec
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc, scheduler_pb2_grpc
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .conftest import agent, code_of, scheduler

TOKENS = {"job": "job-secret", "admin": "admin-secret", "agent": "agent-secret"}
SETTINGS = {f"{role}_token": token for role, token in TOKENS.items()}
LEASE = {"lease_id": "ab12", "secret": "s"}
UNAUTH, DENIED, PASSED = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    "passed",
)

#: method -> (a well-formed request, the role it needs)
SCHEDULER_METHODS: dict[str, tuple[Any, str]] = {
    "Register": (pb.RegisterRequest(job="x", group="g"), "job"),
    "KeepAlive": (pb.KeepAliveRequest(**LEASE), "job"),
    "Unregister": (pb.UnregisterRequest(**LEASE), "job"),
    "Acquire": (pb.AcquireRequest(job="x", group="g", **LEASE), "job"),
    "Yield": (pb.YieldRequest(job="x", group="g", **LEASE), "job"),
    "GetGroup": (pb.GetGroupRequest(group="g"), "job"),
    "ListGroups": (pb.ListGroupsRequest(), "job"),
    "Watch": (pb.WatchRequest(group="g"), "job"),
    "GetEvents": (pb.GetEventsRequest(group="g"), "job"),
    "PutGroup": (pb.PutGroupRequest(spec=pb.GroupSpec(name="h")), "admin"),
    "DeleteGroup": (pb.DeleteGroupRequest(group="g"), "admin"),
    "RegisterAgent": (pb.RegisterAgentRequest(node="n9", address="127.0.0.1:9"), "agent"),
}


def _expected(needed: str, token: str | None) -> Any:
    if token is None or token not in TOKENS.values():
        return UNAUTH
    if token in (TOKENS["admin"], TOKENS[needed]):
        return PASSED
    return DENIED


async def _call(stub: Any, method: str, request: Any) -> grpc.StatusCode:
    if method == "Watch":

        async def first() -> None:
            async for _ in stub.Watch(request, timeout=2):
                return

        return await code_of(first())
    return await code_of(getattr(stub, method)(request, timeout=5))


@pytest.mark.parametrize("token", [None, "not-a-token", *TOKENS.values()])
async def test_every_scheduler_method_checks_its_role_and_refusals_change_nothing(
    token: str | None,
) -> None:
    async with scheduler(**SETTINGS) as running:
        running.engine.put_group(GroupSpec(name="g"))
        async with open_channel(running.address, token=token) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for method, (request, needed) in SCHEDULER_METHODS.items():
                before = {n: r.state for n, r in running.engine.groups.items()}
                agents = dict(running.coordinator.agents)
                code = await _call(stub, method, request)
                expected = _expected(needed, token)
                if expected is PASSED:
                    assert code not in (UNAUTH, DENIED), (method, code)
                    continue
                assert code == expected, (method, token, code)
                assert {n: r.state for n, r in running.engine.groups.items()} == before
                assert running.coordinator.agents == agents
            health = health_pb2_grpc.HealthStub(channel)
            answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


AGENT_METHODS = {
    "Snapshot": apb.SnapshotRequest(job="a", group="g", epoch=1),
    "Restore": apb.RestoreRequest(job="a", group="g", epoch=1),
    "Release": apb.ReleaseRequest(job="a", group="g", force=True),
    "Status": apb.AgentStatusRequest(),
    "Probe": apb.ProbeRequest(),
}


@pytest.mark.parametrize("token", [None, "not-the-agent-token", TOKENS["job"]])
async def test_every_agent_method_needs_the_agent_token_and_a_refusal_changes_nothing(
    agent_dirs: Callable[[str], dict[str, Any]],
    spawn_worker: Callable[..., Any],
    token: str | None,
) -> None:
    async with agent(agent_dirs("n1"), token=TOKENS["agent"]) as running:
        worker = await spawn_worker(running, "a")
        assert (await worker.call(op="init", size=1 << 20, seed=1))["ok"]
        async with open_channel(running.address, token=TOKENS["agent"]) as good:
            trusted = agent_pb2_grpc.AgentStub(good)
            before = await trusted.Status(apb.AgentStatusRequest(), timeout=5)
            async with open_channel(running.address, token=token) as channel:
                stub = agent_pb2_grpc.AgentStub(channel)
                for method, request in AGENT_METHODS.items():
                    assert await code_of(getattr(stub, method)(request, timeout=5)) == UNAUTH
            after = await trusted.Status(apb.AgentStatusRequest(), timeout=5)
        assert [j.SerializeToString() for j in after.jobs] == [
            j.SerializeToString() for j in before.jobs
        ]
        assert worker.state not in ("T", "")
        assert (await worker.call(op="hash"))["ok"]


async def test_the_scheduler_calls_agents_with_its_agent_token(
    agent_dirs: Callable[[str], dict[str, Any]], spawn_worker: Callable[..., Any]
) -> None:
    async with (
        scheduler(**SETTINGS, auto_create_groups=True) as sched,
        agent(agent_dirs("n1"), token=TOKENS["agent"], scheduler=sched.address) as node,
    ):
        assert node.scheduler_link is not None
        assert await node.scheduler_link.wait_registered(10)
        worker = await spawn_worker(node, "a")
        async with (
            AsyncClient(job="a", group="g", scheduler=sched.address, token=TOKENS["job"]) as a,
            AsyncClient(job="b", group="g", scheduler=sched.address, token=TOKENS["job"]) as b,
        ):
            await a.acquire(timeout=10)
            await worker.call(op="init", size=1 << 20, seed=1)
            await a.yield_()
            grant = await b.acquire(timeout=10)
            assert grant.moved_bytes == 1 << 20
            assert worker.state == "T"
            await b.yield_()


async def test_a_scheduler_with_a_wrong_agent_token_is_refused_and_the_job_runs_on(
    agent_dirs: Callable[[str], dict[str, Any]], spawn_worker: Callable[..., Any]
) -> None:
    wrong = {**SETTINGS, "agent_token": "not-the-agents-token"}
    async with (
        scheduler(**wrong, auto_create_groups=True) as sched,
        agent(agent_dirs("n1"), token=TOKENS["agent"]) as node,
    ):
        async with open_channel(sched.address, token=TOKENS["admin"]) as channel:
            await scheduler_pb2_grpc.SchedulerStub(channel).RegisterAgent(
                pb.RegisterAgentRequest(node="n1", address=node.address), timeout=5
            )
        worker = await spawn_worker(node, "a")
        async with (
            AsyncClient(job="a", group="g", scheduler=sched.address, token=TOKENS["job"]) as a,
            AsyncClient(job="b", group="g", scheduler=sched.address, token=TOKENS["job"]) as b,
        ):
            await a.acquire(timeout=10)
            await worker.call(op="init", size=1 << 20, seed=1)
            await a.yield_()
            with pytest.raises(FailedPreconditionError, match=r"node n1.*UNAUTHENTICATED"):
                await b.acquire(timeout=10)
            assert worker.state not in ("T", "")
            status = await node.engine.status()
            assert [(j.record.job, j.record.state.value) for j in status.jobs] == [("a", "running")]


async def test_an_agent_with_a_wrong_token_is_never_registered_with_the_scheduler(
    agent_dirs: Callable[[str], dict[str, Any]],
) -> None:
    async with (
        scheduler(**SETTINGS) as sched,
        agent(agent_dirs("n1"), token="not-the-agent-token", scheduler=sched.address) as node,
    ):
        assert node.scheduler_link is not None
        assert not await node.scheduler_link.wait_registered(1.0)
        assert sched.coordinator.agents == {}
        await asyncio.sleep(0)
