"""Every RPC of both services, fuzzed from the proto descriptors (`descriptors.py`).

The method lists come from `scheduler.proto` and `agent.proto` themselves, so an RPC
added later is fuzzed without a line here. Each method gets random and boundary-valued
requests (the live lease, job and group among the values, so calls reach deep paths)
against a live scheduler (job `a` holds group `g`) and a live agent (a real worker
process registered as job `a`); server-streaming methods are read for one answer.
For every call: the code is never UNKNOWN, INTERNAL, UNIMPLEMENTED or DATA_LOSS, a
refusal's message is one line, a refused call changed no state, and the server answers
health SERVING afterwards.

Wrong roles, for every method of both services, against servers with tokens: no token is
UNAUTHENTICATED, a valid token of another role is PERMISSION_DENIED (the admin token
passes everywhere), and nothing changes. A request over the 4 MiB limit to any method is
RESOURCE_EXHAUSTED and changes nothing. The bounded CI run draws 20 requests a method,
derandomized under CI (the same draws every run); locally each run explores anew.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings

from rlslice.config import GroupSpec
from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.scheduler.service import METHOD_ROLES as SCHEDULER_ROLES
from rlslice.snapshot_agent.service import METHOD_ROLES as AGENT_ROLES
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .conftest import BROKEN, LiveAgent, LiveScheduler, Loop, serving
from .descriptors import messages

SCHEDULER = pb.DESCRIPTOR.services_by_name["Scheduler"]
AGENT = apb.DESCRIPTOR.services_by_name["Agent"]
EXAMPLES = 20
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=os.environ.get("CI") == "true",  # CI: the same draws every run, no flake
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def call(
    channel: grpc.Channel,
    service: ServiceDescriptor,
    method: MethodDescriptor,
    request: Message,
    timeout: float = 0.5,
    metadata: tuple[tuple[str, str], ...] = (),
) -> grpc.StatusCode:
    """Call `method` generically; the status code (a stream is read for one answer)."""
    path = f"/{service.full_name}/{method.name}"
    reply = GetMessageClass(method.output_type)
    options: dict[str, Any] = {
        "request_serializer": type(request).SerializeToString,
        "response_deserializer": reply.FromString,
    }
    try:
        if method.server_streaming:
            stream = channel.unary_stream(path, **options)(
                request, timeout=timeout, metadata=metadata
            )
            try:
                next(iter(stream))
            finally:
                stream.cancel()
        else:
            channel.unary_unary(path, **options)(request, timeout=timeout, metadata=metadata)
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
        details = error.details() or ""  # type: ignore[attr-defined]
        assert code not in BROKEN, (method.name, code, details)
        assert "\n" not in details, (method.name, details)
        return code
    return grpc.StatusCode.OK


def _pools(live: LiveScheduler) -> dict[str, list[str]]:
    return {
        "job": ["a", "b"],
        "group": ["g", "h"],
        "lease_id": [live.lease.lease_id],
        "secret": [live.lease.secret],
        "name": ["g", "a"],
        "node": ["n1"],
        "backend": ["sim"],
    }


@pytest.mark.parametrize("name", [m.name for m in SCHEDULER.methods])
def test_every_scheduler_rpc_survives_fuzzed_requests(live_scheduler: LiveScheduler, name: str) -> None:  # fmt: skip
    live = live_scheduler
    method = SCHEDULER.methods_by_name[name]

    @FUZZ
    @given(request=messages(method.input_type, _pools(live)))
    def check(request: Message) -> None:
        if name == "Unregister" and getattr(request, "lease_id", "") == live.lease.lease_id:
            request.lease_id = "0"  # keep the fixture's lease: the answer's code is the point
        if name == "DeleteGroup" and getattr(request, "group", "") == "g":
            request.group = "h"
        before = live.states()
        code = call(live.channel, SCHEDULER, method, request)
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED):
            assert live.states() == before, (name, code)

    check()
    assert serving(live.channel)
    assert "a" in live.states()["g"].jobs


@pytest.mark.parametrize("name", [m.name for m in AGENT.methods])
def test_every_agent_rpc_survives_fuzzed_requests(live_agent: LiveAgent, name: str) -> None:
    live = live_agent
    method = AGENT.methods_by_name[name]
    pools = {"job": ["a", "b"], "group": ["g", "h"], "backend": ["sim"], "node": ["n1"]}

    @FUZZ
    @given(request=messages(method.input_type, pools))
    def check(request: Message) -> None:
        before = live.records()
        code = call(live.channel, AGENT, method, request, timeout=2.0)
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED):
            assert live.records() == before, (name, code)

    check()
    assert serving(live.channel)


TOKENS = {"job_token": "job-secret", "admin_token": "admin-secret", "agent_token": "agent-secret"}
_WRONG = {"job": "agent-secret", "agent": "job-secret", "admin": "job-secret"}


@pytest.fixture(scope="module")
def guarded(loop: Loop) -> Iterator[tuple[Any, grpc.Channel]]:
    settings_ = SchedulerSettings(address="127.0.0.1:0", groups=(GroupSpec(name="g"),), **TOKENS)
    running = loop.run(start_scheduler(settings_))
    channel = grpc.insecure_channel(running.address)
    yield running, channel
    channel.close()
    loop.run(running.stop(0.1))


@pytest.mark.parametrize("path", sorted(SCHEDULER_ROLES))
def test_a_scheduler_call_without_its_role_is_refused_and_changes_nothing(
    guarded: tuple[Any, grpc.Channel], loop: Loop, path: str
) -> None:
    running, channel = guarded
    method = SCHEDULER.methods_by_name[path.rsplit("/", 1)[1]]
    role = SCHEDULER_ROLES[path].value
    request = GetMessageClass(method.input_type)()

    async def states() -> dict[str, Any]:
        return {name: r.state for name, r in running.engine.groups.items()}

    before = loop.run(states())
    assert call(channel, SCHEDULER, method, request) == grpc.StatusCode.UNAUTHENTICATED
    wrong = (("authorization", f"Bearer {_WRONG[role]}"),)
    assert call(channel, SCHEDULER, method, request, metadata=wrong) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert loop.run(states()) == before
    admin = (("authorization", "Bearer admin-secret"),)
    passed = call(channel, SCHEDULER, method, request, metadata=admin)
    assert passed not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


@pytest.mark.parametrize("path", sorted(AGENT_ROLES))
def test_an_agent_call_without_the_agent_token_is_refused_and_changes_nothing(
    live_agent: LiveAgent, path: str, tmp_path: Any
) -> None:
    from rlslice.snapshot_agent import AgentSettings, SimSettings, start_agent

    live = live_agent
    method = AGENT.methods_by_name[path.rsplit("/", 1)[1]]
    settings_ = AgentSettings(
        node="n9",
        state_dir=tmp_path / "state",
        socket_path=tmp_path / "n9.sock",
        token="agent-secret",
        sim=SimSettings(root=tmp_path / "sim"),
    )
    running = live.loop.run(start_agent(settings_))
    try:
        with grpc.insecure_channel(running.address) as channel:
            request = GetMessageClass(method.input_type)()
            assert call(channel, AGENT, method, request) == grpc.StatusCode.UNAUTHENTICATED
            wrong = (("authorization", "Bearer job-secret"),)
            assert call(channel, AGENT, method, request, metadata=wrong) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
    finally:
        live.loop.run(running.stop(0))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


#: A request body over the 4 MiB message limit: one unknown length-delimited field (number
#: 2**29 - 1), so it means the same to every request type.
OVERSIZED = _varint(((2**29 - 1) << 3) | 2) + _varint(5 << 20) + b"a" * (5 << 20)


@pytest.mark.parametrize(
    ("service", "name"),
    [(SCHEDULER, m.name) for m in SCHEDULER.methods] + [(AGENT, m.name) for m in AGENT.methods],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_an_oversized_request_to_any_rpc_is_resource_exhausted(
    live_scheduler: LiveScheduler, live_agent: LiveAgent, service: ServiceDescriptor, name: str
) -> None:
    method = service.methods_by_name[name]
    channel = live_scheduler.channel if service is SCHEDULER else live_agent.channel
    path = f"/{service.full_name}/{name}"
    reply = GetMessageClass(method.output_type).FromString
    before = (live_scheduler.states(), live_agent.records())
    make = channel.unary_stream if method.server_streaming else channel.unary_unary
    stub = make(path, request_serializer=lambda raw: raw, response_deserializer=reply)

    def send() -> None:
        answer = stub(OVERSIZED, timeout=10)
        if method.server_streaming:
            next(iter(answer))

    with pytest.raises(grpc.RpcError) as refused:
        send()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert (live_scheduler.states(), live_agent.records()) == before
