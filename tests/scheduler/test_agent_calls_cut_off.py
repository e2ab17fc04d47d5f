"""Whether an agent call was cut off comes from the call, not from its message: a small
Agent servicer over real gRPC (a test double at the protocol boundary) and the coordinator.

Cases:
- a node whose agent answers Status but never answers the Snapshot (its deadline passes
  after the call went out): what it did is unknown, the outgoing job is reported unsure;
- a node where nothing listens (the call never went out): the switch fails, ABORTED for
  the waiter, and nobody is unsure.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from rlslice._errors import AbortedError
from rlslice.scheduler.coordinator import Coordinator
from rlslice.scheduler.core import events
from rlslice.scheduler.store import AgentRecord
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import Driver

GIB = 1 << 30


class Silent(agent_pb2_grpc.AgentServicer):
    """Job `a` of group `g` runs here; a Snapshot is taken in and never answered."""

    def __init__(self) -> None:
        self.snapshots = asyncio.Event()

    async def Status(self, request: Any, context: Any) -> apb.AgentStatus:
        job = apb.AgentJob(job="a", group="g", state=apb.AGENT_JOB_STATE_RUNNING)
        job.device_bytes = GIB
        device = apb.DeviceMemory(total_bytes=GIB, used_bytes=GIB)
        return apb.AgentStatus(jobs=[job], devices=[device])

    async def Snapshot(self, request: Any, context: Any) -> apb.MoveResult:
        self.snapshots.set()
        await asyncio.Event().wait()  # the deadline passes first
        raise AssertionError("unreachable")


@pytest.fixture
async def silent() -> AsyncIterator[tuple[str, Silent]]:
    server = grpc.aio.server()
    servicer = Silent()
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(0)


def _switching_from_a_to_b() -> Driver:
    d = Driver.for_spec(nodes=("n1",))
    d.register("a", device_bytes=GIB)
    d.acquire("a")
    d.finish_switch()
    d.register("b", device_bytes=GIB)
    d.acquire("b")
    d.apply(events.Yield("a"))
    assert d.state.switch is not None
    return d


async def _closed_port() -> int:
    """A port a server listened on and left: nothing listens there now."""
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await server.stop(0)
    return port


async def _switch(address: str) -> events.Event:
    coordinator = Coordinator(rpc_timeout=0.5, status_timeout=0.5, retries=0, overlap=False)
    coordinator.add_agent(AgentRecord(node="n1", address=address))
    d = _switching_from_a_to_b()
    assert d.state.switch is not None
    try:
        return await coordinator.run_switch(d.state, d.state.switch)
    finally:
        await coordinator.close()


async def test_a_snapshot_that_went_out_and_got_no_answer_leaves_its_job_unsure(
    silent: tuple[str, Silent],
) -> None:
    address, servicer = silent
    result = await _switch(address)
    assert servicer.snapshots.is_set()  # the call reached the agent
    assert isinstance(result, events.SnapshotFailed)
    assert "DEADLINE_EXCEEDED" in result.reason
    assert result.unsure == ("a",)
    assert result.kind is AbortedError


async def test_a_call_that_could_not_connect_did_nothing_and_leaves_nobody_unsure() -> None:
    result = await _switch(f"127.0.0.1:{await _closed_port()}")
    assert isinstance(result, events.SnapshotFailed)
    assert "node n1" in result.reason
    assert result.unsure == ()
    assert result.kind is AbortedError
