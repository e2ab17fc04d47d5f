"""The agent <-> job workload stream (`app` backend) broken mid-snapshot and mid-restore.

An `app` job moves itself: its process keeps a gRPC stream open to the agent over the
agent's Unix socket (`LocalAgent.Workload`, relayed by the agent's SO_PEERCRED relay) and
answers OFFLOAD / RESTORE on it (`appjob.py`: device memory that is a bytearray, run on
CPU). The test holds the job's move in the middle (its offloader waits at a gate), then
breaks that stream for real: it takes the job process's socket connected to the agent's
path (`pidfd_getfd`, as root) and shuts it down both ways, the way a dying relay or a reset
connection ends it. Neither process is killed.

Real `rlslice scheduler` and `rlslice agent` processes; two `app` jobs that never share the
device (the group's headroom is larger than any device, so every switch parks the holder).

Asserted for both stages: the waiter's acquire fails with a reason (ABORTED, naming the
node) within SWITCH_BOUND, and is never granted while the move is broken; no job is ever
stopped (an `app` move never freezes); no two holders; once the job's offload loop has
reconnected (it does by itself), the job whose move was broken acquires again and its bytes
are identical and back on its device (the move completed in the job after the cut and
the job undid it, since the agent's rollback could not reach it); then
the next switch both ways works and both jobs' bytes are intact.

A move that completes in the job after its stream broke is undone in the job
(`client/offload/_serve._stream`: an OFFLOAD is restored, a RESTORE offloaded again), so the
job is where the agent believes it is; its offload loop then reconnects by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rlslice import AbortedError, FailedPreconditionError
from rlslice.client import AsyncClient
from rlslice.testing import child_env

from .conftest import eventually, proc_state

if TYPE_CHECKING:
    from conftest import Faults

APPJOB = Path(__file__).with_name("appjob.py")
MiB = 1 << 20
STATE = 1 * MiB
#: Two switch attempts, each failing at once (the broken stream, then no stream), with room
#: for a loaded 2-core machine.
SWITCH_BOUND = 15.0
_SYS_PIDFD_GETFD = 438  # the same number on every architecture


class AppJob:
    """An `appjob.py` process: commands and answers, and its events apart."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.ensure_future(self._read())

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)
            if "event" in message:
                await self.events.put(message)
            else:
                await self.answers.put(message)

    async def call(self, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        await self.process.stdin.drain()
        return await asyncio.wait_for(self.answers.get(), 20)

    async def event(self, name: str, timeout: float = 20.0) -> None:
        """Wait for event `name`, skipping others; fail at once if the offload loop ended."""
        async with asyncio.timeout(timeout):
            while (event := await self.events.get())["event"] != name:
                assert event["event"] != "ended", f"the job's offload loop stopped: {event}"

    async def digest(self) -> tuple[str, bool]:
        answer = await self.call(op="hash")
        return answer["hash"], answer["on_device"]

    async def stop(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), 10)


@contextlib.asynccontextmanager
async def app_job(f: Faults, job: str) -> AsyncIterator[AppJob]:
    """A started `appjob.py` of `job` on n1, its workload stream open."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(APPJOB),
        str(f.cluster.agents["n1"].socket_path),
        job,
        "g",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=(f.cluster.work / f"{job}.log").open("ab"),
        env=child_env(),
    )
    running = AppJob(process)
    try:
        assert "pid" in await asyncio.wait_for(running.answers.get(), 20)
        await running.event("connected")
        yield running
    finally:
        await running.stop()


def cut_stream(pid: int, agent_socket: Path) -> int:
    """Shut down, both ways, every socket of process `pid` connected to `agent_socket`
    (the job's workload stream and its channel); how many."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    cut = 0
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            fd = libc.syscall(_SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                continue
            with socket.socket(fileno=fd) as sock:
                if sock.family != socket.AF_UNIX:
                    continue
                with contextlib.suppress(OSError):
                    if sock.getpeername() == str(agent_socket):
                        sock.shutdown(socket.SHUT_RDWR)
                        cut += 1
    finally:
        os.close(pidfd)
    return cut


def _client(f: Faults, job: str) -> AsyncClient:
    return AsyncClient(
        job=job, group="g", scheduler=f.address, lease_seconds=30, device_bytes=STATE
    )


@pytest.mark.parametrize("stage", ["snapshot", "restore"])
async def test_a_workload_stream_cut_mid_move_fails_the_switch_and_loses_nothing(
    faults: Callable[..., Any], stage: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (pidfd_getfd of the job's socket)")
    async with faults() as f:
        await f.put_group(name="g", backend="app", headroom_bytes=1 << 50)
        socket_path = f.cluster.agents["n1"].socket_path
        async with (
            app_job(f, "a") as job_a,
            app_job(f, "b") as job_b,
            _client(f, "a") as a,
            _client(f, "b") as b,
        ):
            await a.acquire()
            hash_a = (await job_a.call(op="init", size=STATE, seed=1))["hash"]
            await a.yield_()
            await b.acquire()  # a is parked: offloaded to its host buffer
            assert await job_a.digest() == (hash_a, False)
            hash_b = (await job_b.call(op="init", size=STATE, seed=2))["hash"]
            # The job whose move is broken, and the one that waits for the group.
            broken, broken_job, waiter = (b, job_b, a) if stage == "snapshot" else (a, job_a, a)
            await broken_job.call(op="gate", closed=True)
            waiting = asyncio.ensure_future(waiter.acquire(timeout=60))
            await eventually(lambda: _queued(f, "a"))
            await b.yield_()
            await broken_job.event("offloading" if stage == "snapshot" else "restoring")
            assert cut_stream(broken_job.pid, socket_path) >= 1
            cut = time.monotonic()
            with pytest.raises((AbortedError, FailedPreconditionError), match="node n1") as failed:
                await waiting
            assert time.monotonic() - cut <= SWITCH_BOUND
            print(f"{stage}: answered {time.monotonic() - cut:.2f} s after the cut: {failed.value}")
            assert proc_state(job_a.pid) not in ("T", "")
            assert proc_state(job_b.pid) != "T"
            await f.check()
            # The move completes in the job; its offload loop reconnects by itself.
            await broken_job.call(op="gate", closed=False)
            await broken_job.event("connected")
            again = await broken.acquire(timeout=30)
            assert await (job_b if broken is b else job_a).digest() == (
                (hash_b, True) if broken is b else (hash_a, True)
            )
            await f.check()
            # The next switches both ways work, bytes intact.
            other = a if broken is b else b
            other_job, other_hash = (job_a, hash_a) if broken is b else (job_b, hash_b)
            waiting = asyncio.ensure_future(other.acquire(timeout=30))
            await eventually(lambda: _queued(f, other.job))
            await broken.yield_()
            assert (await waiting).epoch > again.epoch
            assert await other_job.digest() == (other_hash, True)
            assert (await broken_job.digest())[1] is False  # parked by the switch
            await other.yield_()
            await broken.acquire(timeout=30)
            assert (await broken_job.digest())[1] is True
            await f.check()
            await broken.yield_()


async def _queued(f: Faults, job: str) -> bool:
    return job in (await f.group()).queue
