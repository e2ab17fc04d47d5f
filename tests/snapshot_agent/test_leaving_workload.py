"""An `app` job whose offload loop ended is not waited for: a real agent on a Unix socket.

Cases (a job registered a moment ago whose stream is still attaching is waited for:
tests/system/gpu/test_app_backend.py):
- a job whose last stream closed in this agent's life (its offload loop ended: the job is
  leaving) is not: a snapshot is refused at once, naming serve_offload, well before the
  agent's wait for a stream would end;
- a job whose stream never opened is waited for until its last process exits, not longer:
  the snapshot waiting for it is refused as soon as the process is gone.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.adapters.channel import open_channel
from rlslice.snapshot_agent.agent import start_agent
from rlslice.snapshot_agent.engine import WORKLOAD_ATTACH_SECONDS
from rlslice.snapshot_agent.settings import AgentSettings
from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc


@pytest.fixture
async def agent(tmp_path: Path) -> Any:
    settings = AgentSettings(
        node="n1",
        address="127.0.0.1:0",
        socket_path=tmp_path / "agent.sock",
        state_dir=tmp_path / "state",
        backend="app",
    )
    running = await start_agent(settings)
    yield running
    await running.stop()


async def _register(agent: Any) -> None:
    async with open_channel(f"unix:{agent.socket_path}") as channel:
        await agent_pb2_grpc.LocalAgentStub(channel).Register(
            agent_pb2.LocalRegisterRequest(
                job="job-a", group="g", modes=[agent_pb2.OFFLOAD_MODE_OFFLOAD], backend="app"
            ),
            timeout=10,
        )


async def _open_and_close_a_stream(agent: Any) -> None:
    """What an offload loop that stops does: hello, then the end of its side. The agent's
    side ends after it has let go of the stream, so when the call ends it is detached."""
    async with open_channel(f"unix:{agent.socket_path}") as channel:
        call = agent_pb2_grpc.LocalAgentStub(channel).Workload()
        hello = agent_pb2.WorkloadHello(
            job="job-a", group="g", modes=[agent_pb2.OFFLOAD_MODE_OFFLOAD]
        )
        await call.write(agent_pb2.WorkloadMessage(hello=hello))
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:  # type: ignore[attr-defined]
            pass


async def _snapshot(agent: Any) -> Any:
    async with open_channel(agent.address, token=agent.token) as channel:
        return await agent_pb2_grpc.AgentStub(channel).Snapshot(
            agent_pb2.SnapshotRequest(job="job-a", group="g", epoch=1), timeout=30
        )


async def test_a_job_whose_offload_loop_ended_is_refused_at_once(agent: Any) -> None:
    await _register(agent)
    await _open_and_close_a_stream(agent)
    assert agent.engine.table.entries["job-a"].workloads == []
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await asyncio.wait_for(_snapshot(agent), WORKLOAD_ATTACH_SECONDS / 2)
    assert "serve_offload" in (refused.value.details() or "")


REGISTER_AND_WAIT = """
import sys
import grpc
from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc
with grpc.insecure_channel("unix:" + sys.argv[1]) as channel:
    agent_pb2_grpc.LocalAgentStub(channel).Register(
        agent_pb2.LocalRegisterRequest(
            job="job-a", group="g", modes=[agent_pb2.OFFLOAD_MODE_OFFLOAD], backend="app"
        ),
        timeout=10,
    )
print("registered", flush=True)
sys.stdin.read()  # until the test closes it
"""


async def test_the_wait_for_a_stream_ends_when_the_jobs_last_process_exits(agent: Any) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        REGISTER_AND_WAIT,
        str(agent.socket_path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert (await child.stdout.readline()).strip() == b"registered"
        entry = agent.engine.table.entries["job-a"]
        snapshot = asyncio.ensure_future(_snapshot(agent))
        for _ in range(500):  # until the move holds the job: it waits for the stream now
            if entry.lock.locked():
                break
            await asyncio.sleep(0.01)
        assert entry.lock.locked()
        child.stdin.close()  # the job's last process exits
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(snapshot, WORKLOAD_ATTACH_SECONDS / 2)
        assert "serve_offload" in (refused.value.details() or "")
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()
