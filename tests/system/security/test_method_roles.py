"""Every RPC has a role, checked against the proto; a served method without one is refused.

Cases:
- every method of every service in the protocol is either in a role table (Scheduler,
  Agent) or served only on the agent's Unix socket behind the credential relay (LocalAgent);
- `method_roles` refuses a table that misses a method of the service, and one that names a
  method the service does not have, naming them;
- a server whose table lacks a method it serves refuses that method with PERMISSION_DENIED,
  even with every role open (no tokens), and the handler never runs; listed methods work;
- health is open; a method the server does not serve stays UNIMPLEMENTED;
- the exposure rule is one rule for both servers: beyond loopback, a role without a token
  is refused unless mutual TLS authenticates callers (TLS without client CAs is not enough).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlslice import InvalidArgumentError
from rlslice.adapters.auth import Role
from rlslice.adapters.channel import open_channel
from rlslice.adapters.server import GrpcServer, check_exposure, method_roles
from rlslice.config import TLSConfig
from rlslice.scheduler.service import METHOD_ROLES as SCHEDULER_ROLES
from rlslice.snapshot_agent.service import METHOD_ROLES as AGENT_ROLES
from rlslice.v1alpha1 import agent_pb2, scheduler_pb2, scheduler_pb2_grpc

SCHEDULER = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"]
AGENT = agent_pb2.DESCRIPTOR.services_by_name["Agent"]
LOCAL_ONLY = {"rlslice.v1alpha1.LocalAgent"}


def test_every_method_of_every_service_has_a_role_or_is_local_only() -> None:
    tables = {**SCHEDULER_ROLES, **AGENT_ROLES}
    for file in (scheduler_pb2.DESCRIPTOR, agent_pb2.DESCRIPTOR):
        for service in file.services_by_name.values():
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                assert path in tables or service.full_name in LOCAL_ONLY, path
    assert set(tables) == {
        f"/{s.full_name}/{m.name}" for s in (SCHEDULER, AGENT) for m in s.methods
    }


def test_a_table_missing_a_method_or_naming_an_unknown_one_is_refused() -> None:
    roles = {m.name: Role.JOB for m in SCHEDULER.methods}
    missing = {k: v for k, v in roles.items() if k != "Yield"}
    with pytest.raises(ValueError, match=r"missing \['Yield'\]"):
        method_roles(SCHEDULER, missing)
    with pytest.raises(ValueError, match=r"not in the proto \['Steal'\]"):
        method_roles(SCHEDULER, {**roles, "Steal": Role.JOB})
    assert method_roles(SCHEDULER, roles)["/rlslice.v1alpha1.Scheduler/Yield"] is Role.JOB


class _Groups(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def GetGroup(self, request: object, context: object) -> scheduler_pb2.GroupStatus:
        self.calls.append("GetGroup")
        return scheduler_pb2.GroupStatus()

    async def ListGroups(
        self, request: object, context: object
    ) -> scheduler_pb2.ListGroupsResponse:
        self.calls.append("ListGroups")
        return scheduler_pb2.ListGroupsResponse()


async def test_a_served_method_without_a_role_is_refused_and_never_runs() -> None:
    table = {k: v for k, v in SCHEDULER_ROLES.items() if not k.endswith("/GetGroup")}
    server = await GrpcServer.create(
        tokens={Role.JOB: None, Role.ADMIN: None, Role.AGENT: None},
        methods=table,
        services=(SCHEDULER.full_name,),
    )
    servicer = _Groups()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server.server)
    address = await server.start("127.0.0.1:0", None)
    await server.set_serving(True)
    try:
        async with open_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetGroup(scheduler_pb2.GetGroupRequest(group="g"), timeout=5)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "no role is defined for method" in (refused.value.details() or "")
            await stub.ListGroups(scheduler_pb2.ListGroupsRequest(), timeout=5)
            health = health_pb2_grpc.HealthStub(channel)
            answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            unserved = channel.unary_unary("/rlslice.v1alpha1.Nothing/Here")
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await unserved(b"", timeout=5)
            assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(0)
    assert servicer.calls == ["ListGroups"]


def test_beyond_loopback_an_open_role_is_refused_and_mutual_tls_covers_only_jobs(
    tmp_path: Path,
) -> None:
    flags = {Role.AGENT: "--token-file", Role.JOB: "--job-token-file"}
    server_tls = TLSConfig(cert=tmp_path / "c.pem", key=tmp_path / "k.pem")
    with pytest.raises(InvalidArgumentError, match=r"^address: 0\.0\.0\.0:1 .* agent role is"):
        check_exposure("0.0.0.0:1", {Role.AGENT: None}, server_tls, token_flags=flags)
    mutual = server_tls.model_copy(update={"client_ca": tmp_path / "ca.pem"})
    # Any certificate of the CA (a job's too) must not be an agent: the token stays needed.
    with pytest.raises(InvalidArgumentError, match="agent role is open"):
        check_exposure("0.0.0.0:1", {Role.AGENT: None}, mutual, token_flags=flags)
    check_exposure("0.0.0.0:1", {Role.JOB: None, Role.AGENT: "t"}, mutual, token_flags=flags)
    check_exposure("0.0.0.0:1", {Role.AGENT: "t"}, None, token_flags=flags)
    check_exposure("[::1]:1", {Role.AGENT: None}, None, token_flags=flags)
