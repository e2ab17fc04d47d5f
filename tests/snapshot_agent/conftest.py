"""Fixtures for the agent tests: real agents on loopback, real job processes.

Sockets live in short folders under /tmp (Unix socket paths are limited to 107 bytes);
emulated device memory lives under /dev/shm in a folder of its own per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlslice.adapters.channel import open_channel
from rlslice.snapshot_agent import AgentSettings, RunningAgent, SimSettings, start_agent
from rlslice.v1alpha1 import agent_pb2_grpc

JOBPROC = Path(__file__).with_name("jobproc.py")
MiB = 1 << 20


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RLSLICE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def shm_root() -> Iterator[Path]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = Path(tempfile.mkdtemp(prefix="rlslice-test-", dir=base))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ra-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def make_settings(tmp_path: Path, shm_root: Path, short_dir: Path) -> Callable[..., AgentSettings]:
    def make(node: str = "n1", **overrides: Any) -> AgentSettings:
        """Settings of an agent of its own for `node` (state, socket and devices apart)."""
        sim = {"root": shm_root, "capacity_bytes": 64 * MiB, "rate_gbps": 0.0}
        sim.update(overrides.pop("sim", {}))
        fields: dict[str, Any] = {
            "node": node,
            "state_dir": tmp_path / f"state-{node}",
            "socket_path": short_dir / f"{node}.sock",
            "host_reserve_bytes": 0,
            "sim": SimSettings(**sim),
        }
        fields.update(overrides)
        return AgentSettings(**fields)

    return make


@pytest.fixture
async def agent(make_settings: Callable[..., AgentSettings]) -> AsyncIterator[RunningAgent]:
    running = await start_agent(make_settings())
    yield running
    await running.stop(0)


@pytest.fixture
async def stub(agent: RunningAgent) -> AsyncIterator[Any]:
    channel = open_channel(agent.address, token=agent.token)
    yield agent_pb2_grpc.AgentStub(channel)
    await channel.close(None)


class JobProcess:
    """A running `jobproc.py`: its first JSON line in `info`, commands through `ask()`."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.info: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        return self.process.pid

    async def read(self, timeout: float = 10.0) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        assert line, "the job process ended"
        result: dict[str, Any] = json.loads(line)
        return result

    async def ask(self, command: str, timeout: float = 10.0) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        await self.process.stdin.drain()
        return await self.read(timeout)

    async def quit(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.write(b"quit\n")
        await self.process.stdin.drain()
        return await asyncio.wait_for(self.process.wait(), 10)

    def kill(self) -> None:
        for pid in (self.info.get("child", 0), self.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)


def proc_state(pid: int) -> str:
    """One-letter scheduler state of `pid` ('T' when stopped), '' when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text[text.rfind(")") + 2]


@pytest.fixture
async def spawn_job(agent: RunningAgent, shm_root: Path) -> AsyncIterator[Callable[..., Any]]:
    started: list[JobProcess] = []

    async def spawn(
        job: str = "job-a",
        group: str = "g1",
        size: int = 4 * MiB,
        *flags: str,
        running: RunningAgent | None = None,
    ) -> JobProcess:
        target = running or agent
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(JOBPROC),
            str(target.socket_path),
            str(target.settings.sim.root / target.node),
            job,
            group,
            str(size),
            *flags,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        job_process = JobProcess(process)
        started.append(job_process)
        job_process.info = await job_process.read(timeout=20)
        return job_process

    yield spawn
    for job_process in started:
        job_process.kill()
        with contextlib.suppress(ProcessLookupError, TimeoutError):
            await asyncio.wait_for(job_process.process.wait(), 5)


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """The first truthy value of `check()` (sync or async) within `timeout`, else fail."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert loop.time() < give_up, "the condition never held"
        await asyncio.sleep(0.02)
