"""The agent acts only on processes it verified itself; nothing listens beyond loopback by
default; the `app` backend only talks to the job's own local server.

Cases:
- the registered pid is the caller's own, read from the socket's peer credentials; the
  request has no field that could name a pid;
- LocalAgent is not served on the agent's TCP port (UNIMPLEMENTED there), and a call that
  reaches the private gRPC socket without the credential relay is PERMISSION_DENIED; the
  private socket's folder is the agent's only (0700), the public socket 0660;
- a process registered for one job cannot be claimed by another job (FAILED_PRECONDITION);
- a Snapshot naming a job that has no verified process moves nothing (absent): no process
  of this test, nor any other, is stopped;
- by default the agent and the scheduler listen on loopback; an agent asked to listen
  beyond loopback without a token or TLS refuses to start;
- a local-server port outside 1-65535 or an unknown server kind is INVALID_ARGUMENT; the
  workload side refuses any host but loopback.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice import InvalidArgumentError
from rlslice.adapters.channel import open_channel
from rlslice.client._local import register_with_agent_async
from rlslice.scheduler import SchedulerSettings
from rlslice.snapshot_agent import AgentSettings
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import agent, code_of


async def test_the_registered_pid_is_the_callers_own(
    agent_dirs: Callable[[str], dict[str, Any]], spawn_worker: Callable[..., Any]
) -> None:
    async with agent(agent_dirs("n1")) as running:
        worker = await spawn_worker(running, "a")
        assert worker.info["registered_pid"] == worker.process.pid
        status = await running.engine.status()
        assert [list(j.pids) for j in status.jobs] == [[worker.process.pid]]
    fields = {f.name for f in apb.LocalRegisterRequest.DESCRIPTOR.fields}
    assert not any("pid" in name for name in fields), fields


async def test_local_registration_is_served_only_through_the_credential_relay(
    agent_dirs: Callable[[str], dict[str, Any]],
) -> None:
    async with agent(agent_dirs("n1")) as running:
        request = apb.LocalRegisterRequest(job="a", group="g")
        async with open_channel(running.address, token=running.token) as channel:
            tcp = agent_pb2_grpc.LocalAgentStub(channel)
            assert await code_of(tcp.Register(request, timeout=5)) == grpc.StatusCode.UNIMPLEMENTED
        private = running._relay.internal_address
        async with open_channel(private) as channel:
            bypass = agent_pb2_grpc.LocalAgentStub(channel)
            code = await code_of(bypass.Register(request, timeout=5))
            assert code == grpc.StatusCode.PERMISSION_DENIED
        folder = Path(private.removeprefix("unix:")).parent
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(running.socket_path.stat().st_mode) == 0o660
        assert (await running.engine.status()).jobs == ()


async def test_a_process_of_one_job_cannot_be_claimed_by_another(
    agent_dirs: Callable[[str], dict[str, Any]],
) -> None:
    async with agent(agent_dirs("n1")) as running:
        first = await register_with_agent_async(running.socket_path, "a", "g")
        assert first.pid == os.getpid()
        try:
            with pytest.raises(Exception, match="registered to job a") as caught:
                await register_with_agent_async(running.socket_path, "b", "g")
            assert "FailedPrecondition" in type(caught.value).__name__
            jobs = (await running.engine.status()).jobs
            # Only job a, with this process among its pids (a registration takes the
            # caller's descendants too: in a full run, earlier fixtures' daemons).
            assert [(j.record.job, os.getpid() in j.pids) for j in jobs] == [("a", True)]
        finally:
            # This test process registered itself: forget it before anything could move it.
            await running.engine.release("a", "g", force=True)


async def test_a_snapshot_naming_an_unverified_job_moves_nothing(
    agent_dirs: Callable[[str], dict[str, Any]], spawn_worker: Callable[..., Any]
) -> None:
    async with agent(agent_dirs("n1")) as running:
        worker = await spawn_worker(running, "a")
        async with open_channel(running.address, token=running.token) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            answer = await stub.Snapshot(apb.SnapshotRequest(job="b", group="g", epoch=1))
            assert answer.absent
            assert answer.bytes == 0
        assert worker.state not in ("T", "")
        assert [j.record.job for j in (await running.engine.status()).jobs] == ["a"]


def test_by_default_the_agent_and_the_scheduler_listen_on_loopback(tmp_path: Path) -> None:
    assert AgentSettings(node="n1", state_dir=tmp_path).address.startswith("127.0.0.1:")
    assert SchedulerSettings().address.startswith("127.0.0.1:")
    assert SchedulerSettings().metrics_address == "127.0.0.1"


@pytest.mark.parametrize("address", ["0.0.0.0:0", "[::]:0"])
async def test_an_agent_beyond_loopback_without_token_or_tls_refuses_to_start(
    agent_dirs: Callable[[str], dict[str, Any]], address: str
) -> None:
    with pytest.raises(InvalidArgumentError, match="token"):
        async with agent(agent_dirs("n1"), address=address):
            pass  # pragma: no cover


async def test_an_agent_beyond_loopback_with_a_token_starts(
    agent_dirs: Callable[[str], dict[str, Any]],
) -> None:
    async with agent(agent_dirs("n1"), address="0.0.0.0:0", token="agent-t") as running:
        async with open_channel(running.address.replace("0.0.0.0", "127.0.0.1")) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            code = await code_of(stub.Status(apb.AgentStatusRequest(), timeout=5))
        assert code == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("kind", "port", "field"),
    [("vllm", 0, "local_server_port"), ("vllm", 70000, "local_server_port"), ("curl", 8000, "local_server_kind")],
)  # fmt: skip
async def test_a_local_server_that_is_not_a_local_port_is_refused(
    agent_dirs: Callable[[str], dict[str, Any]], kind: str, port: int, field: str
) -> None:
    async with agent(agent_dirs("n1")) as running:
        with pytest.raises(InvalidArgumentError, match=field):
            await register_with_agent_async(
                running.socket_path, "a", "g", backend="app", local_server=(kind, port)
            )
        assert (await running.engine.status()).jobs == ()


@pytest.mark.parametrize("host", ["10.0.0.1", "example.invalid", "0.0.0.0"])
def test_the_workload_only_calls_a_server_on_loopback(host: str) -> None:
    from rlslice.client.offload._http import OffloadHttpServer

    with pytest.raises(InvalidArgumentError, match="host"):
        OffloadHttpServer(8000, host=host)
