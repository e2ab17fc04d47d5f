"""Local registration over the agent's Unix socket: the pid comes from the kernel only.

Case matrix:
- the agent answers with the caller's own pid (read from SO_PEERCRED)
- a request that smuggles another pid (an unknown field) still registers only the caller
- a call straight to the private gRPC socket (not through the relay) is refused
- LocalAgent is not served on the TCP port
- a process that registers and exits is dropped
- one process cannot join two jobs; a job cannot be in two groups on one node
- the socket's permission bits are as configured; a live agent's socket is not taken over,
  a stale one is replaced
- `rlslice run` launches the command registered, with the job's environment, and passes on
  its exit status and SIGTERM
- the workload stream: hello, then a command and its reply
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.adapters.channel import open_channel
from rlslice.snapshot_agent import AgentSettings, RunningAgent, start_agent
from rlslice.snapshot_agent.backends.base import OffloadAction
from rlslice.snapshot_agent.peercred import SocketInUseError
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import MiB, eventually

SMUGGLER = r"""
import sys, os, grpc
from rlslice.v1alpha1 import agent_pb2 as apb
request = apb.LocalRegisterRequest(job="job-a", group="g1").SerializeToString()
# field 99, varint: a pid that is not ours (1, init), as an attacker would send it
request += bytes([0x98, 0x06, 0x01])
with grpc.insecure_channel("unix:" + sys.argv[1]) as channel:
    call = channel.unary_unary(
        "/rlslice.v1alpha1.LocalAgent/Register",
        request_serializer=lambda b: b,
        response_deserializer=apb.LocalRegisterResponse.FromString,
    )
    print(call(request, timeout=10).pid, os.getpid(), flush=True)
sys.stdin.readline()
"""


async def _status(stub: Any) -> apb.AgentStatus:
    status: apb.AgentStatus = await stub.Status(apb.AgentStatusRequest())
    return status


async def test_the_agent_registers_the_caller_by_its_peer_credentials(
    stub: Any, spawn_job: Callable[..., Any]
) -> None:
    job = await spawn_job("job-a", "g1", 1 * MiB)
    assert job.info["registered_pid"] == job.pid
    status = await _status(stub)
    assert [list(j.pids) for j in status.jobs] == [[job.pid]]


async def test_a_pid_smuggled_into_the_request_is_ignored(agent: RunningAgent, stub: Any) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SMUGGLER,
        str(agent.socket_path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        answered, own = map(int, (await asyncio.wait_for(process.stdout.readline(), 20)).split())
        assert answered == own == process.pid
        status = await _status(stub)
        assert [list(j.pids) for j in status.jobs] == [[process.pid]]
    finally:
        process.kill()
        await process.wait()


async def test_a_call_that_bypasses_the_relay_is_refused(agent: RunningAgent) -> None:
    private = agent._relay.internal_address
    async with grpc.aio.insecure_channel(private) as channel:
        stub = agent_pb2_grpc.LocalAgentStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Register(apb.LocalRegisterRequest(job="job-a", group="g1"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert not agent.engine.table.entries


async def test_local_registration_is_not_served_on_the_tcp_port(agent: RunningAgent) -> None:
    channel = open_channel(agent.address)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await agent_pb2_grpc.LocalAgentStub(channel).Register(
                apb.LocalRegisterRequest(job="job-a", group="g1"), timeout=5
            )
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await channel.close(None)


async def test_a_process_that_registers_and_exits_is_dropped(
    agent: RunningAgent, stub: Any
) -> None:
    code = (
        "import sys\nfrom rlslice.client._local import register_with_agent\n"
        "print(register_with_agent(sys.argv[1], 'job-a', 'g1').pid)"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, str(agent.socket_path), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), 20)
    assert int(out) == process.pid

    async def dropped() -> bool:
        return not (await _status(stub)).jobs

    await eventually(dropped)


async def test_one_process_cannot_join_two_jobs_nor_a_job_two_groups(
    agent: RunningAgent, spawn_job: Callable[..., Any]
) -> None:
    from rlslice._errors import FailedPreconditionError
    from rlslice.client._local import register_with_agent_async

    await spawn_job("job-a", "g1", 0)
    # This test process registers itself: the agent sees the pytest pid.
    with pytest.raises(FailedPreconditionError, match="group"):
        await register_with_agent_async(agent.socket_path, "job-a", "g2")
    await register_with_agent_async(agent.socket_path, "job-b", "g1")
    with pytest.raises(FailedPreconditionError, match="registered to job job-b"):
        await register_with_agent_async(agent.socket_path, "job-c", "g1")
    agent.engine.table.entries.pop("job-b")  # never snapshot the test runner itself


@pytest.mark.parametrize("mode", [0o660, 0o666])
async def test_the_socket_gets_the_configured_permission_bits(
    make_settings: Callable[..., AgentSettings], mode: int
) -> None:
    running = await start_agent(make_settings("n2", socket_mode=mode))
    try:
        assert stat.S_IMODE(os.stat(running.socket_path).st_mode) == mode
    finally:
        await running.stop(0)


async def test_a_live_agents_socket_is_not_taken_over_and_a_stale_one_is_replaced(
    agent: RunningAgent, make_settings: Callable[..., AgentSettings]
) -> None:
    with pytest.raises(SocketInUseError):
        await start_agent(make_settings("n2", socket_path=agent.socket_path))
    stale = agent.socket_path.with_name("stale.sock")
    import socket

    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))
    leftover.close()  # a socket file nobody listens on
    running = await start_agent(make_settings("n3", socket_path=stale))
    await running.stop(0)


async def test_rlslice_run_launches_the_command_registered_with_the_jobs_environment(
    agent: RunningAgent, stub: Any, tmp_path: Path
) -> None:
    report = tmp_path / "env.txt"
    script = (
        "import os, sys, time\n"
        f"open({str(report)!r}, 'w').write(' '.join([str(os.getpid())] + "
        "[os.environ.get(k, '-') for k in ('RLSLICE_JOB', 'RLSLICE_GROUP', "
        "'RLSLICE_AGENT_REGISTERED', 'RLSLICE_NODE', 'RLSLICE_SCHEDULER')]))\n"
        "sys.stdin.readline()\n"
        "sys.exit(7)\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlslice.apps", "run", "--job", "job-r", "--group", "g1",
        "--agent-socket", str(agent.socket_path), "--scheduler", "127.0.0.1:1",
        "--", sys.executable, "-c", script,
        stdin=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await eventually(lambda: report.exists() and report.read_text(), timeout=20)
        pid, *env = report.read_text().split()
        assert env == ["job-r", "g1", "1", "n1", "127.0.0.1:1"]
        status = await _status(stub)
        assert [(j.job, list(j.pids)) for j in status.jobs] == [("job-r", [int(pid)])]
        assert int(pid) != process.pid  # the command, not the wrapper
        assert process.stdin is not None
        process.stdin.write(b"\n")
        await process.stdin.drain()
        assert await asyncio.wait_for(process.wait(), 20) == 7
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_rlslice_run_forwards_sigterm_to_the_command(agent: RunningAgent) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlslice.apps", "run", "--job", "job-r", "--group", "g1",
        "--agent-socket", str(agent.socket_path), "--",
        sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    assert await asyncio.wait_for(process.stdout.readline(), 20) == b"up\n"
    process.terminate()
    assert await asyncio.wait_for(process.wait(), 20) == 128 + 15


async def test_a_workload_stream_carries_commands_and_replies(
    agent: RunningAgent, spawn_job: Callable[..., Any]
) -> None:
    code = r"""
import sys, grpc
from rlslice.v1alpha1 import agent_pb2 as apb, agent_pb2_grpc
with grpc.insecure_channel("unix:" + sys.argv[1]) as channel:
    stub = agent_pb2_grpc.LocalAgentStub(channel)
    import queue
    out = queue.Queue()
    out.put(apb.WorkloadMessage(hello=apb.WorkloadHello(
        job="job-w", group="g1", modes=[apb.OFFLOAD_MODE_OFFLOAD], tags=["weights"])))
    def messages():
        while (m := out.get()) is not None:
            yield m
    for command in stub.Workload(messages()):
        out.put(apb.WorkloadMessage(reply=apb.WorkloadReply(
            command_id=command.command_id, ok=True, bytes=123, seconds=0.01)))
        out.put(None)
"""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, str(agent.socket_path)
    )
    try:
        await eventually(
            lambda: (
                "job-w" in agent.engine.table.entries
                and agent.engine.table.entries["job-w"].workloads
            ),
            timeout=20,
        )
        link = agent.engine.table.entries["job-w"].workloads[0]
        assert link.modes == frozenset({"offload"})
        assert link.tags == ("weights",)
        answer = await link.command(OffloadAction.OFFLOAD, epoch=3, discard_tags=(), timeout=10)
        assert answer.ok
        assert answer.bytes == 123
        assert await asyncio.wait_for(process.wait(), 20) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
