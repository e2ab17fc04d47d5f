"""Local agent registration by the client, against a real agent and a real job process.

Cases:
- RLSLICE_AGENT_SOCKET set: the job process registers itself with the agent on its first
  call (the agent sees the process's own pid) and marks RLSLICE_AGENT_REGISTERED;
- RLSLICE_AGENT_REGISTERED already set (a launcher did it): the client does not register;
- the socket names no agent: the first call fails with UnavailableError and the job is not
  registered with the scheduler either (a job the agent cannot see must not run sliced).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlslice._errors import UnavailableError
from rlslice.adapters.channel import open_channel
from rlslice.client import AsyncClient
from rlslice.snapshot_agent import AgentSettings, RunningAgent, SimSettings, start_agent
from rlslice.testing import TestScheduler
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

MiB = 1 << 20

JOB = """
import os, sys
from rlslice import Client
client = Client()
grant = client.acquire(timeout=20)
print(os.getpid(), os.environ.get("RLSLICE_AGENT_REGISTERED"), grant.job, flush=True)
sys.stdin.readline()
client.close()
"""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))  # Unix socket paths are short
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None  # emulated device memory
    folder = Path(tempfile.mkdtemp(prefix="rlslice-client-test-", dir=base))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def agent(short_dir: Path, shm_dir: Path) -> AsyncIterator[RunningAgent]:
    settings = AgentSettings(
        node="n1",
        state_dir=short_dir / "state",
        socket_path=short_dir / "a.sock",
        host_reserve_bytes=0,
        sim=SimSettings(root=shm_dir, capacity_bytes=16 * MiB, rate_gbps=0.0),
    )
    running = await start_agent(settings)
    yield running
    await running.stop(0)


async def agent_jobs(agent: RunningAgent) -> dict[str, list[int]]:
    async with open_channel(agent.address, token=agent.token) as channel:
        stub: Any = agent_pb2_grpc.AgentStub(channel)
        status = await stub.Status(apb.AgentStatusRequest(), timeout=10)
    return {job.job: list(job.pids) for job in status.jobs}


async def test_a_job_process_registers_itself_with_the_agent(
    sched: TestScheduler, agent: RunningAgent
) -> None:
    env = {
        **os.environ,
        "PYTHONSAFEPATH": "1",
        "RLSLICE_SCHEDULER": sched.address,
        "RLSLICE_JOB": "job-a",
        "RLSLICE_GROUP": "gpus",
        "RLSLICE_AGENT_SOCKET": str(agent.socket_path),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        JOB,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        pid, registered, job = line.decode().split()
        assert (int(pid), registered, job) == (process.pid, "1", "job-a")
        assert (await agent_jobs(agent)).get("job-a") == [process.pid]
        assert (await sched.group("gpus")).holder == "job-a"
    finally:
        process.stdin.write(b"\n")
        await process.stdin.drain()
        assert await asyncio.wait_for(process.wait(), 20) == 0


async def test_a_process_registered_by_its_launcher_does_not_register_again(
    sched: TestScheduler, agent: RunningAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSLICE_AGENT_SOCKET", str(agent.socket_path))
    monkeypatch.setenv("RLSLICE_AGENT_REGISTERED", "1")
    async with AsyncClient(job="job-a", group="gpus", scheduler=sched.address) as client:
        await client.acquire(timeout=10)
    assert await agent_jobs(agent) == {}


async def test_without_an_agent_at_the_socket_the_first_call_fails(
    sched: TestScheduler, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSLICE_AGENT_SOCKET", str(short_dir / "nobody.sock"))
    async with AsyncClient(job="job-a", group="gpus", scheduler=sched.address) as client:
        with pytest.raises(UnavailableError):
            await client.acquire(timeout=10)
    assert "RLSLICE_AGENT_REGISTERED" not in os.environ
    assert len((await sched.group("gpus")).jobs) == 0
