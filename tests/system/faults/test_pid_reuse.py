"""The agent never acts on a process that merely took a registered job's pid.

A real recycle: after the job's worker dies, the test writes the dead pid minus one to
`/proc/sys/kernel/ns_last_pid` and forks, so a stranger (a plain sleeping process,
registered with nobody) gets the very same pid; real `rlslice agent` process, `sim` backend.

Cases (each: the job's worker registered and RUNNING with emulated device memory, then
SIGKILLed and its pid given to the stranger):
- while the agent runs: its pidfd saw the exit, the job keeps no process; a Snapshot of
  the job does not stop the stranger, and Status never lists the stranger's pid;
- across an agent restart (the agent SIGKILLed first, so it saw nothing): it reloads the
  pid from its job table, finds another start time there, and drops it; the same Snapshot
  leaves the stranger running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rlslice.adapters.auth import local_agent_token
from rlslice.adapters.channel import open_channel
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import proc_state

if TYPE_CHECKING:
    from conftest import Faults

MiB = 1 << 20
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


def _spawn_with_pid(pid: int, tries: int = 200) -> subprocess.Popen[bytes]:
    """A sleeping stranger process with pid `pid` (other forks on the machine may take
    the pid first: tried again until it lands)."""
    for _ in range(tries):
        NS_LAST_PID.write_text(str(pid - 1))
        child = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"],
            stdin=subprocess.DEVNULL,
        )
        if child.pid == pid:
            return child
        child.kill()
        child.wait()
    pytest.fail(f"pid {pid} could not be recycled in {tries} tries")


@pytest.fixture
def recycler() -> Any:
    if os.geteuid() != 0 or not os.access(NS_LAST_PID, os.W_OK):
        why = f"needs root to write {NS_LAST_PID}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    made: list[subprocess.Popen[bytes]] = []

    def make(pid: int) -> subprocess.Popen[bytes]:
        child = _spawn_with_pid(pid)
        made.append(child)
        return child

    yield make
    for child in made:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(10)


@pytest.mark.parametrize("restart", [False, True], ids=["agent-running", "agent-restarted"])
async def test_a_recycled_pid_is_never_acted_on(
    faults: Callable[..., Any], recycler: Callable[[int], subprocess.Popen[bytes]], restart: bool
) -> None:
    async with faults(capacity_bytes=8 * MiB) as f:
        await f.put_group(name="g")
        worker = await f.worker("n1", "a")
        assert (await worker.call(op="init", size=MiB, seed=3))["ok"]
        entry = await f.agent_job("n1", "a")
        assert entry is not None
        assert list(entry.pids) == [worker.pid]
        agent = f.cluster.agents["n1"].service
        if restart:
            agent.kill()
        pid = worker.pid
        worker.kill()
        await worker.reap()
        stranger = recycler(pid)
        if restart:
            await agent.restart()
        else:
            await f.eventually(lambda: _has_no_pid(f, pid))
        address = f.cluster.agents["n1"].service.address
        async with open_channel(address, token=local_agent_token()) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            request = apb.SnapshotRequest(job="a", group="g", epoch=101)
            with contextlib.suppress(Exception):  # absent or refused: either way, no action
                await stub.Snapshot(request, timeout=20)
        assert proc_state(stranger.pid) not in ("T", ""), "the agent stopped a stranger"
        assert await _has_no_pid(f, pid)


async def _has_no_pid(f: Faults, pid: int) -> bool:
    status = await f.agent_status("n1")
    return all(pid not in entry.pids for entry in status.jobs)
